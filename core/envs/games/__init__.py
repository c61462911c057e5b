"""RAGEN's text games: grid.py (what they share: answer parsing, rendering, seeded splits),
frozenlake.py, sokoban.py, bandit.py, corridor.py. Observations are plain text, each a new user message."""
