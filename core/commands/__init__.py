"""The command lines: what ``agentrl COMMAND`` runs, each a ``main(argv) -> exit status``.

    agentrl    the front door (pyproject.toml's console script): ``agentrl COMMAND ARGS``
    train      train and record one run                         python -m core.train
    branch     branch-from-turn continuations of a trajectory   python -m core.branch
    evaluate   a checkpoint on another evaluation's tasks       python -m core.evaluation
    clusters   failure clusters of a run                        python -m core.clusters
    endpoint   a local model over the OpenAI-compatible protocol  python -m core.endpoint_server

Each parses its flags and hands the work to the library (core/run, core/jobs, core/serve). The
``python -m`` names on the right are fixed (users' scripts call them): each is a thin module at
core's top that runs the ``main`` here.
"""
