"""edgespec's device SDK (``edgespec.edge``), and the version of the whole package.

edgespec is assembled from the repository's top-level folders, one namespace package
``edgespec`` whose layout is ``src/edgespec/`` (a link per subpackage, what Python and static
tools read):

- ``edgespec.v1`` (``proto/edgespec/v1``): the wire contract and its generated code;
- ``edgespec.edge`` (``edge/``): this SDK (numpy, onnxruntime, grpcio, tokenizers only);
- ``edgespec.cloud`` (``cloud/``): the Ray Serve verifier and the torch tooling;
- ``edgespec.cli`` (``cli/``): the ``edgespec`` command, one module per subcommand.

Imports point one way: v1 <- edge <- cloud.serving <- cloud tooling <- cli.
"""

__version__ = "0.1.0"
