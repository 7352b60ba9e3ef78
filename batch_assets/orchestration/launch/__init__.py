"""Every way a run of a pipeline starts on its own: schedules, sensors on new source files and the automation
sensor, gathered per pipeline by `paths.launch_definitions`; claims keep two of them off one partition at once."""
