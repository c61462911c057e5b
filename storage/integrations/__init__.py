"""Recording other trainers' runs while they train (``storage.integrations.trl``: TRL's
``GRPOTrainer``). Each integration writes through ``storage.recorder.Recorder``: one transaction
per step, the same tables the trainer writes, so every page reads these runs as it reads ours."""
