"""Offline tooling for a draft/target pair: export, distillation, training, data.

    export        a Hugging Face causal LM -> an ONNX draft with its manifest and parity check
    distill       align a draft to a target (KL(p || q)), optionally on target-generated text
    loop          the one training loop: budget, LR schedule, checkpoints, run log
    data          token sources for training loops
    alignment     KL, alpha and greedy agreement as pure functions over logits
    continuation  continuing prompts with a model, keeping every position's logits
    tiny          tiny random draft/target pairs built in seconds (tests, trying the stack)
"""
