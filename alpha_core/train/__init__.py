"""Trainers: the flagship's (`perception`), the supervised bar members' (`supervised`) and the RL agents' (`rl`); the
two bar trainers share their fold summary and fold loop (`bar_folds`)."""
