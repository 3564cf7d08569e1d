"""The verifier on Ray Serve: what runs in a replica, from the gRPC handlers down to the accept rule.

    deployment   gRPC handlers (Session, Generate, Info, Health) behind Serve's gRPC ingress
    codec        wire messages <-> session types
    session      a session's state machine and the validation of everything a client sends
    scheduler    gathers the sessions waiting for a verdict into one batch when the model is free
    verifier     one batch: rows -> backend -> commit each round within its stop/length/context limits
    backend      where the target runs (this process, or an engine child process)
    engine       the target model: sessions in the KV pool, one packed forward per batch
    kv_pool      the preallocated KV pool, its pages and each session's page table
    paged_attention  attention over the pool: packed rows, read in place, no padding
    padded       the padded batch kept for families whose attention bypasses the interface (Falcon before transformers 5.25)
    trees        a tree draft's depths and ancestors
    accept       the accept rule, the target distribution p and the batch adapter (pure)
    metrics      Prometheus metrics through Ray Serve
    config       VerifierConfig and DeploymentOptions
    app          building and starting the Serve application

Serving imports the edge SDK's shared types (``edgespec.edge.params``, ``wire``, ``errors``)
and nothing of the tooling (training, link, bench, simulate, demo).
"""
