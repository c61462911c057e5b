"""The apps environment (AppWorld-like): a stateful world of apps over SQLite, graded by unit
tests on the final database.

    env.py         the Environment and Episode: actions <tool>, <code>, <answer>
    api.py         endpoint registry, argument checking, documentation
    endpoints/     the endpoints, by app
    sandbox/       the isolated subprocess that runs <code> actions
    tasks.py       task templates' base, the planted facts and the unit-test grader
    templates/     the task templates, by theme
    world.py       the schema, the change-logging store and the seeded world generator
"""
