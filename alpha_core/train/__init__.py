"""Trainers: the flagship perception trainer (and, later, the supervised and RL trainers)."""
