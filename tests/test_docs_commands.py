"""Every shell command in the README and the docs is run somewhere: by a test (named here, and checked to exist)
or by `make demo` / `make test`. A command added to the docs without a test fails this guard; so does a claim
that points at a test that no longer exists. The S3 walk-through's command is run here, as written, against a
real S3-protocol server on loopback.

Every page of docs/ is scanned.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHELL_FENCES = {"bash", "sh", "shell", "console"}

# (pattern a documented command must match in full, where it is run: "tests/file.py::function" or a make target)
COVERED: list[tuple[str, str]] = [
    (r"make demo", "make demo"),
    (r"make test", "make test (CI: .ci/run)"),
    (r"\.venv/bin/dg check defs", "tests/test_dg.py::test_dg_check_and_list_defs"),
    (r"\.venv/bin/dg list defs", "tests/test_dg.py::test_dg_check_and_list_defs"),
    (r"\.venv/bin/dg scaffold defs batch_assets\.components\.BatchInferencePipeline \w+",
     "tests/test_dg.py::test_scaffolded_component_pipeline_materializes"),
    (r'\.venv/bin/dg launch --assets "group:\w+" --partition [\w-]+',
     "tests/test_dg.py::test_scaffolded_component_pipeline_materializes"),
    (r'\.venv/bin/dg launch --assets "group:\w+" --partition-range "[\w-]+\.\.\.[\w-]+"',
     "tests/test_dg.py::test_scaffolded_component_pipeline_materializes"),
    # docs/concepts.md, two-dimensional partitions: the page's two commands, read from it and run as written
    (r'\.venv/bin/dg launch --assets "group:app_reviews" --partition(-range)? "[\w|.-]+"',
     "tests/orchestration/launch/test_multi_partitions.py::test_day_by_app_partition_then_a_range_through_dg_launch"),
    (r'BATCH_STORAGE_ROOT=s3://\S+ AWS_REGION=\S+ \.venv/bin/dg launch --assets "group:document_embeddings" '
     r"--partition shard-00-of-04", "tests/test_docs_commands.py::test_the_s3_command_runs_as_written"),
    (r'CMAKE_ARGS="-DGGML_NATIVE=OFF" \.venv/bin/pip install "llama-cpp-python\[server\]==0\.3\.36"',
     "make test (the Makefile's llama-cpp-python step runs this install)"),
    (r"\.venv/bin/python -m llama_cpp\.server --model .* --host 127\.0\.0\.1 --port 8080",
     "tests/resources/openai_api/llama_server.py::start_llama_server"),
    (r"AWS_ALLOW_HTTP=true AWS_ENDPOINT_URL=\S+ \.venv/bin/python query_s3\.py",
     "tests/stages/sinks/test_lancedb.py::test_docs_s3_query_example_runs_with_allow_http"),
    # docs/launch-paths.md: every command of the page, read from it and run as written
    (r"dagster asset materialize -m batch_assets\.definitions --select 'group:daily_review_sentiment' "
     r"--partition(-range)? \S+", "tests/orchestration/launch/test_launch_path_commands.py::test_launch_path_commands_run_as_written"),
    (r"DAGSTER_HOME=\$PWD/\.dagster_home \.venv/bin/python -m batch_assets\.commands\.backfill daily_review_sentiment "
     r"--from \S+ --to \S+", "tests/orchestration/launch/test_daemon_launches.py::"
     "test_documented_backfills_under_make_ui_follow_the_spec_policy_and_never_infer_twice"),
    (r"DAGSTER_HOME=\$PWD/\.dagster_home \.venv/bin/dagster job backfill -w workspace\.yaml -j "
     r"daily_review_sentiment_job --partitions \S+ --noprompt", "tests/orchestration/launch/test_daemon_launches.py::"
     "test_documented_backfills_under_make_ui_follow_the_spec_policy_and_never_infer_twice"),
    (r"dagster instance concurrency (set 'endpoint:api\.openai\.com' 2|get --all)",
     "tests/orchestration/launch/test_launch_path_commands.py::test_launch_path_commands_run_as_written"),
    # docs/BENCHMARKS.md: `make bench` runs bench/run.py, which the smoke test runs at tiny sizes with the same knobs
    (r"((BENCH_PROFILE|BENCH_PEERS|BENCH_SECTIONS|BENCH_BEFORE_TREE)=\S+ )?make bench",
     "tests/test_bench_smoke.py::test_bench_harness_at_tiny_sizes"),
    # docs/deployment.md, step one: the pre-deploy check, and the air-gapped install's flag (rendered with it)
    (r'make k8s-check( K8S_VALUES="[^"]+")?( DAGSTER_CHART=\S+)?', "tests/k8s/test_k8s_check.py::"
     "test_make_k8s_check_fails_on_the_values_that_would_crash_loop_and_on_a_pod_restricted_refuses"),
    (r"helm upgrade --install dagster \./dagster-1\.13\.27\.tgz -n batch -f k8s/values\.yaml --skip-schema-validation",
     "tests/k8s/test_k8s_check.py::test_an_air_gapped_install_renders_with_skip_schema_validation"),
]
# Pages whose every shell block is run, in order and as written, by one test (which checks it ran them all).
PAGES_RUN_WHOLE = {
    "docs/adding-to-a-project.md": "tests/test_installed_wheel.py::test_the_wheel_installs_into_a_create_dagster_project",
}
# Commands that cannot run on the CPU machines this project is tested on, with the reason the docs also give.
NOT_RUNNABLE = {
    "pip install 'batch-assets[vllm]'": "vLLM is a CUDA-only wheel that needs torch 2.14 (docs/providers-vllm.md)",
}


def documented_commands() -> list[tuple[str, str]]:
    """(page, command) for every command in a shell fence; continuation lines joined, comments dropped."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    found = []
    for page in pages:
        for lang, body in re.findall(r"^\s*```(\w*)\n(.*?)^\s*```", page.read_text(), re.S | re.M):
            if lang not in SHELL_FENCES:
                continue
            for line in re.sub(r"\\\n\s*", "", body).splitlines():
                command = re.sub(r"\s+#.*$", "", line.strip().removeprefix("$ ")).rstrip(" &")
                if command and not command.startswith("#"):
                    found.append((page.relative_to(ROOT).as_posix(), command))
    return found


def test_every_documented_command_is_run_somewhere() -> None:
    commands = documented_commands()
    assert len(commands) >= 8, commands  # the scan itself works
    uncovered = [(page, cmd) for page, cmd in commands if page not in PAGES_RUN_WHOLE
                 and cmd not in NOT_RUNNABLE and not any(re.fullmatch(p, cmd) for p, _ in COVERED)]
    assert not uncovered, ("documented commands that no test or make target runs; add a test and list it in "
                           f"COVERED: {uncovered}")


def test_every_claimed_test_exists() -> None:
    for _, where in [*COVERED, *PAGES_RUN_WHOLE.items()]:
        if "::" not in where:
            continue
        file, function = where.split("::")
        assert re.search(rf"def {function}\(", (ROOT / file).read_text()), f"{where} does not exist"


@pytest.mark.slow
def test_the_s3_command_runs_as_written(tmp_path: Path, s3_bucket: str) -> None:
    """docs/running-on-s3.md's command, with the bucket pointed at the loopback S3 server."""
    import pyarrow.parquet as pq
    import s3fs

    page_commands = [cmd for page, cmd in documented_commands() if page == "docs/running-on-s3.md"]
    assert len(page_commands) == 1
    words = shlex.split(page_commands[0].replace("s3://my-bucket/batch", f"{s3_bucket}/batch"))
    env = {k: v for k, v in os.environ.items() if k != "BATCH_PIPELINES_DIR"}
    while "=" in words[0]:
        key, value = words.pop(0).split("=", 1)
        env[key] = value
    env["AWS_REGION"] = "us-east-1"  # the loopback server's region; the doc's value is an example
    home = tmp_path / "home"
    home.mkdir()
    shutil.copyfile(ROOT / "dagster.yaml", home / "dagster.yaml")
    env["DAGSTER_HOME"] = str(home)
    proc = subprocess.run(words, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    fs = s3fs.S3FileSystem(skip_instance_cache=True, client_kwargs={"endpoint_url": os.environ["AWS_ENDPOINT_URL"]})
    path = f"{s3_bucket.removeprefix('s3://')}/batch/document_embeddings/output/shard-00-of-04.parquet"
    with fs.open(path, "rb") as f:
        assert pq.ParquetFile(f).metadata.num_rows > 0
