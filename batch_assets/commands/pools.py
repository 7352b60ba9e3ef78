"""`python -m batch_assets.commands.pools status [pool]` / `free <run id>`: who holds the Dagster pools' slots, and
freeing the slots of a run that is gone. What the pools are and how the infer step takes its slot:
batch_assets/orchestration/execution/pool_slots.py."""

from __future__ import annotations

import argparse
import sys

import dagster as dg

from batch_assets.orchestration.execution.pool_slots import free_run_slots


def main(argv: list[str] | None = None) -> int:
    """`python -m batch_assets.commands.pools status [pool]` lists who holds each pool's slots; `free <run id>` frees
    the slots of a run that is gone (marking it failed)."""
    parser = argparse.ArgumentParser(prog="python -m batch_assets.commands.pools", description=main.__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    status = sub.add_parser("status", help="who holds the slots of each pool")
    status.add_argument("pool", nargs="?")
    free = sub.add_parser("free", help="free the slots of a run that is gone, and mark it failed")
    free.add_argument("run_id")
    args = parser.parse_args(argv)
    with dg.DagsterInstance.get() as instance:
        if args.command == "free":
            free_run_slots(instance, args.run_id, "Marked failed and its pool slots freed by "
                                                  "`python -m batch_assets.commands.pools free`.")
            print(f"Freed the pool slots of run {args.run_id}.")
            return 0
        pools = [args.pool] if args.pool else sorted(instance.event_log_storage.get_concurrency_keys())
        for pool in pools:
            info = instance.event_log_storage.get_concurrency_info(pool)
            held = ", ".join(f"{s.run_id} ({s.step_key})" for s in info.claimed_slots) or "none"
            print(f"{pool}: {info.slot_count} slot(s), held by: {held}; {info.pending_step_count} step(s) waiting")
    return 0


if __name__ == "__main__":
    sys.exit(main())
