"""rlkit's own inference: what a model argument names, how it loads, and one batched generation loop.

- :mod:`rlkit.inference.reference`: a recipe or run directory as a target; a model reference (run dir,
  adapter or checkpoint dir, merged dir, Hub id, pseudo id) resolved to the base and adapter to load.
- :mod:`rlkit.inference.load`: the loader (base + adapter on the base the run recorded, made ready for
  fast generation by :mod:`rlkit.inference.fastgen`).
- :mod:`rlkit.inference.generate`: the batched generation loop that eval, chat, pairs, rollouts and merge
  verification share.
"""
