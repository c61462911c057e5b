"""The search environment (Search-R1): BM25 search over a seeded fictional world, single- and
two-hop questions.

    env.py     the Environment and Episode: <search> and <answer> actions, retrieval, grading
    world.py   the seeded world: entities, facts, documents
"""
