"""The demo draft/target pair, trained from scratch on the Python standard library's source.

No model hub is reachable, so the project trains its own pair on a corpus every machine has.
The stages (see ``edgespec train-demo``):

1. ``data``: list the stdlib's ``.py`` files, split them by file into train / validation /
   held-out (:mod:`edgespec.cloud.training.corpus`), train a byte-level BPE tokenizer on the train split, encode each
   split into a flat token file and cut prompt files (:mod:`.data`, :mod:`.prompts`);
2. ``target``: pretrain a deep, narrow Llama (:mod:`.pretrain`, shapes in :mod:`.models`);
3. ``draft``: pretrain a two-layer draft on the same tokens (or grow a given one, :func:`.models.grow`);
4. ``generate``: the target's greedy continuations of training windows
   (:mod:`edgespec.cloud.training.target_text`), the text greedy verification asks the draft to guess;
5. ``distill``: align the draft to the target (:mod:`edgespec.cloud.training.distill`), partly on
   that text;
6. ``eval``: losses, alpha, greedy agreement and simulated acceptance length (:mod:`.evaluate`);
7. ``ship`` and ``export``: copy the small artefacts into ``models/demo``, the draft as ONNX.
"""
