"""Running a job: ``run`` prepares a run (config, selection, warm-up, run folder, lock), builds its components and
drives the chosen algorithm to the end, writing what ``rl_core.outputs`` keeps."""
