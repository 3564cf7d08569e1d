"""The cloud side of edgespec: the verifier and the tooling around it.

Layers, each importing only the ones above it in this list (``tests/test_layout.py`` checks):

    serving    the Ray Serve verifier (imports the edge SDK's shared types, nothing below)
    link       network link profiles and the TCP link emulator
    training   export, distillation, the training loop, data, tiny pairs
    simulate   the fleet simulator (discrete events)
    bench      measurements through the real Serve path: tuning workflow, capacity, links
    demo       the demo pair's pipeline and ``make demo``
"""
