"""edgespec: speculative decoding across the edge and the cloud.

The package is assembled from the repository's top-level folders:

- ``edgespec.v1`` (``proto/edgespec/v1``): the wire contract and its generated code;
- ``edgespec.edge`` (``edge/``): the device SDK (numpy, onnxruntime, grpcio, tokenizers only);
- ``edgespec.cloud`` (``cloud/``): the Ray Serve verifier and the torch tooling.
"""

__version__ = "0.1.0"
