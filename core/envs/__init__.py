"""Environments: the protocol (base), Search-R1-style search, the AppWorld-like apps, grid games
and a bandit, every call bounded by the guard, and users' own environments (plugins). Plain text
in and out; never imports torch."""
