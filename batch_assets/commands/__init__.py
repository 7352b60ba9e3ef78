"""The command-line entry points, one module each, run as `python -m batch_assets.commands.<name>`:

- `retry_dead_letters PIPELINE PARTITION`: a partition's failed rows sent to the model again (docs/RELIABILITY.md)
- `backfill PIPELINE --from A --to B`: an asset backfill the daemon runs by the spec's policy (docs/launch-paths.md)
- `pools status [POOL]` / `pools free RUN_ID`: who holds the pools' slots; freeing a dead run's (docs/launch-paths.md)
- `k8s_check`: `make k8s-check`, the deployment checked before it is installed (docs/deployment.md)
- `demo`: `make demo`, the example pipelines through `dg launch`

Those that take a pipeline find it in the catalog (batch_assets/catalog.py) and build only the ones they run, never
the whole code location. `python -m batch_assets.instance` (a DAGSTER_HOME's dagster.yaml) stays where it is: it
finds the dagster.yaml shipped beside it in the wheel (setup.py), and the install page runs it as written.
"""
