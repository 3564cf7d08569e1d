"""The demo draft/target pair, trained from scratch on the Python standard library's source.

No model hub is reachable, so the project trains its own pair on a corpus every machine has.
The stages (see ``edgespec train-demo``):

1. ``data``: list the stdlib's ``.py`` files, split them by file into train / validation /
   held-out (:mod:`.corpus`), train a byte-level BPE tokenizer on the train split, encode each
   split into a flat token file and cut prompt files (:mod:`.data`, :mod:`.prompts`);
2. ``target``: pretrain a deep, narrow Llama (:mod:`.pretrain`, shapes in :mod:`.models`);
3. ``draft``: pretrain a one-layer draft on the same tokens;
4. ``distill``: align the draft to the target (:mod:`edgespec.cloud.training.distill`);
5. ``eval``: losses, alpha, greedy agreement and simulated acceptance length (:mod:`.evaluate`);
6. ``ship``: copy the small artefacts into ``models/demo``.
"""
