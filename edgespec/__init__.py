"""edgespec: speculative decoding across the edge and the cloud.

The package is assembled from the repository's top-level folders (pyproject's package-dir):

- ``edgespec.v1`` (``proto/edgespec/v1``): the wire contract and its generated code;
- ``edgespec.edge`` (``edge/``): the device SDK (numpy, onnxruntime, grpcio, tokenizers only);
- ``edgespec.cloud`` (``cloud/``): the Ray Serve verifier and the torch tooling;
- ``edgespec.cli`` (``edgespec/cli``): the ``edgespec`` command, one module per subcommand.

Imports point one way: v1 <- edge <- cloud.serving <- cloud tooling <- cli.
"""

__version__ = "0.1.0"
