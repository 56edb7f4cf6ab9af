"""`lemon data pull` against a loopback HTTP server that serves the real benchmark files in three modes.

good: the pull installs the files, each sha256 checked, and the loader then reads the benchmark from the cache
with $LEMON_DATA_DIR unset and no shared/datasets folder visible (what a fresh clone sees). corrupt: one byte
changed, so the pull is refused, names both sha256 values and installs nothing. interrupted: the server closes
the connection mid-body, so nothing is half-installed, and a second pull after the server is fixed succeeds.
The server reads the files from ../shared/datasets (or $LEMON_DATA_DIR); without them the module is skipped.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import threading
import zipfile
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Literal

import pytest
from typer.testing import CliRunner

from lemon_core.benchmarks import DataNotFoundError, get
from lemon_core.benchmarks import base as benchmarks_base
from lemon_core.cli import app
from lemon_core.data import MARKER, SOURCES, DataError, config_benchmarks, pull, pull_dataset, verify_installed

REPO = Path(__file__).resolve().parents[1]
_candidates = [Path(os.environ["LEMON_DATA_DIR"])] if os.environ.get("LEMON_DATA_DIR") else []
_candidates.append(REPO.parent / "shared" / "datasets")
DATA = next((p for p in _candidates if (p / "multiarith" / "MultiArith.json").is_file()), None)
NO_DATA = "no raw benchmark files to serve: neither $LEMON_DATA_DIR nor ../shared/datasets holds multiarith/"

Mode = Literal["good", "corrupt", "interrupted"]


class DataServer(ThreadingHTTPServer):
    """Serves every file of ``SOURCES`` at ``/<repo>/<commit>/<path>`` from the shared copy; records requests."""

    daemon_threads = True

    def __init__(self, data: Path) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.routes = {
            f"/{f.repo}/{f.commit}/{f.path}": data / name / f.dest
            for name, entry in SOURCES.items() for f in entry.files
        }
        self.mode: Mode = "good"
        self.requests: list[str] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: DataServer

    def do_GET(self) -> None:  # noqa: N802 - http.server API
        self.server.requests.append(self.path)
        local = self.server.routes.get(self.path)
        if local is None or not local.is_file():
            self.send_error(404)
            return
        body = local.read_bytes()
        if self.server.mode == "corrupt":
            body = body[:100] + bytes([body[100] ^ 0x01]) + body[101:]
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.server.mode == "interrupted":
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            self.close_connection = True  # the socket closes with half the promised body sent
            return
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - http.server API
        pass


@pytest.fixture
def server() -> Iterator[DataServer]:
    if DATA is None:
        pytest.skip(NO_DATA)
    srv = DataServer(DATA)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


@pytest.fixture
def fresh_clone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """What a fresh clone sees: no $LEMON_DATA_DIR, no shared/datasets folder, an empty cache. Returns the
    cache's datasets folder."""
    monkeypatch.delenv("LEMON_DATA_DIR", raising=False)
    monkeypatch.delenv("LEMON_DATA_BASE_URL", raising=False)
    monkeypatch.setenv("LEMON_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(benchmarks_base, "find_shared_datasets", lambda: None)
    monkeypatch.setenv("LEMON_PROGRESS", "off")
    return tmp_path / "cache" / "datasets"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def leftovers(cache: Path) -> list[str]:
    """Anything in the cache besides complete benchmark folders: temp folders, partial files."""
    if not cache.exists():
        return []
    return sorted(str(p.relative_to(cache)) for p in cache.rglob("*")
                  if p.name.startswith(".pull-") or p.name.endswith(".partial"))


def test_nothing_anywhere_names_every_place_and_the_pull(fresh_clone: Path) -> None:
    with pytest.raises(DataNotFoundError) as err:
        get("multiarith").load()
    message = str(err.value)
    for needle in ("$LEMON_DATA_DIR (not set)", "shared folder (no shared/datasets above",
                   f"pull cache {fresh_clone / 'multiarith'} (not there)", "run `lemon data pull multiarith`"):
        assert needle in message, (needle, message)


def test_good_pull_installs_verified_files_and_the_loader_reads_the_cache(
        fresh_clone: Path, server: DataServer) -> None:
    assert DATA is not None
    result = pull_dataset("multiarith", base_url=server.url, progress=False)
    assert (result.state, result.fetched_files, result.folder) == ("pulled", 1, fresh_clone / "multiarith")
    installed = fresh_clone / "multiarith" / "MultiArith.json"
    assert sha256(installed) == SOURCES["multiarith"].files[0].sha256 == sha256(DATA / "multiarith" / "MultiArith.json")
    assert (fresh_clone / "multiarith" / MARKER).is_file()
    assert leftovers(fresh_clone) == []
    assert get("multiarith").folder() == fresh_clone / "multiarith"
    assert get("multiarith").load() == get("multiarith").load(data_dir=DATA)  # same examples, same order

    again = pull_dataset("multiarith", base_url=server.url, progress=False)
    assert again.state == "verified"
    assert len(server.requests) == 1  # installed and verified: not fetched again


def test_mmlu_zip_is_verified_and_unpacked_to_the_loaders_layout(fresh_clone: Path, server: DataServer) -> None:
    assert DATA is not None
    result = pull_dataset("mmlu", base_url=server.url, progress=False)
    assert result.state == "pulled"
    folder = fresh_clone / "mmlu"
    assert len(list((folder / "data" / "val").glob("*_val.csv"))) == 57
    anatomy = Path("data") / "val" / "anatomy_val.csv"
    assert sha256(folder / anatomy) == sha256(DATA / "mmlu" / anatomy)
    assert get("mmlu").load() == get("mmlu").load(data_dir=DATA)
    assert verify_installed("mmlu") == []

    damaged = folder / "data" / "dev" / "anatomy_dev.csv"
    damaged.write_text("tampered\n")
    assert any("anatomy_dev.csv" in p for p in verify_installed("mmlu"))
    repaired = pull_dataset("mmlu", base_url=server.url, progress=False)
    assert (repaired.state, repaired.fetched_files) == ("pulled", 0)  # re-unpacked from the verified zip
    assert sha256(damaged) == sha256(DATA / "mmlu" / "data" / "dev" / "anatomy_dev.csv")
    assert len(server.requests) == 2  # the zip and LICENSE, once each


def test_a_damaged_file_is_fetched_again_and_the_good_ones_are_not(fresh_clone: Path, server: DataServer) -> None:
    pull_dataset("aqua", base_url=server.url, progress=False)
    (fresh_clone / "aqua" / "test.json").write_bytes(b"{}\n")
    server.requests.clear()
    result = pull_dataset("aqua", base_url=server.url, progress=False)
    assert (result.state, result.fetched_files) == ("pulled", 1)
    assert server.requests == [SOURCES["aqua"].files[0].url("")]
    assert verify_installed("aqua") == []


def test_corrupt_download_is_refused_names_both_sha256_and_installs_nothing(
        fresh_clone: Path, server: DataServer) -> None:
    assert DATA is not None
    server.mode = "corrupt"
    good = (DATA / "multiarith" / "MultiArith.json").read_bytes()
    bad_sha = hashlib.sha256(good[:100] + bytes([good[100] ^ 0x01]) + good[101:]).hexdigest()
    with pytest.raises(DataError) as err:
        pull_dataset("multiarith", base_url=server.url, progress=False)
    message = str(err.value)
    entry = SOURCES["multiarith"].files[0]
    for needle in (entry.url(server.url), f"expected {entry.size} bytes with sha256 {entry.sha256}", bad_sha,
                   "nothing was installed"):
        assert needle in message, (needle, message)
    assert not (fresh_clone / "multiarith").exists()
    assert leftovers(fresh_clone) == []
    with pytest.raises(DataNotFoundError, match="lemon data pull multiarith"):
        get("multiarith").load()


def test_interrupted_download_leaves_nothing_and_a_second_pull_succeeds(
        fresh_clone: Path, server: DataServer) -> None:
    server.mode = "interrupted"
    with pytest.raises(DataError) as err:
        pull_dataset("gsm8k", base_url=server.url, progress=False)
    assert SOURCES["gsm8k"].files[0].url(server.url) in str(err.value)
    assert "pull again" in str(err.value)
    assert not (fresh_clone / "gsm8k").exists()
    assert leftovers(fresh_clone) == []

    server.mode = "good"
    result = pull_dataset("gsm8k", base_url=server.url, progress=False)
    assert result.state == "pulled"
    assert verify_installed("gsm8k") == []
    assert len(get("gsm8k").load("test")) == 1319


def test_search_order_falls_through_per_benchmark(fresh_clone: Path, server: DataServer, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """$LEMON_DATA_DIR holding only svamp: svamp loads from there, multiarith from the cache behind it."""
    assert DATA is not None
    pull_dataset("multiarith", base_url=server.url, progress=False)
    own = tmp_path / "own"
    (own / "svamp").mkdir(parents=True)
    (own / "svamp" / "SVAMP.json").write_bytes((DATA / "svamp" / "SVAMP.json").read_bytes())
    monkeypatch.setenv("LEMON_DATA_DIR", str(own))
    assert get("svamp").folder() == own / "svamp"
    assert get("multiarith").folder() == fresh_clone / "multiarith"
    monkeypatch.setattr(benchmarks_base, "find_shared_datasets", lambda: DATA)
    assert get("multiarith").folder() == DATA / "multiarith"  # the shared folder comes before the cache


def test_pull_skips_what_the_loader_already_finds(fresh_clone: Path, server: DataServer,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """CI has the shared folder and no internet: `make run`'s pull must say so and fetch nothing."""
    monkeypatch.setattr(benchmarks_base, "find_shared_datasets", lambda: DATA)
    [result] = pull(["multiarith"], base_url=server.url, progress=False)
    assert (result.state, result.where) == ("available", "shared folder")
    assert server.requests == []
    assert not fresh_clone.exists()


def test_config_data_dir_without_the_benchmark_is_an_error_not_a_pull(fresh_clone: Path, server: DataServer,
                                                                      tmp_path: Path) -> None:
    with pytest.raises(DataError, match="has no multiarith/ folder and the loader reads only there"):
        pull(["multiarith"], data_dir=tmp_path, base_url=server.url, progress=False)
    assert server.requests == []


def test_config_names_the_benchmarks_of_prepare_and_evaluate(tmp_path: Path) -> None:
    assert config_benchmarks(REPO / "configs" / "local-cpu.yaml") == (["multiarith"], None)
    pipeline = tmp_path / "p.yaml"
    pipeline.write_text("prepare: {benchmarks: [gsm8k, svamp], data_dir: /somewhere}\n"
                        "evaluate: {benchmarks: [gsm8k]}\ntrain: {data: {benchmarks: [aqua]}}\n")
    assert config_benchmarks(pipeline) == (["gsm8k", "svamp", "aqua"], "/somewhere")
    assert config_benchmarks("train-cpu")[0] == ["multiarith"]  # a train config: its data section


def test_zip_member_outside_the_folder_is_refused(fresh_clone: Path, tmp_path: Path) -> None:
    from lemon_core.data import _unpack

    evil = tmp_path / "evil.zip"
    with zipfile.ZipFile(evil, "w") as zf:
        zf.writestr("../escaped.txt", "x")
    with pytest.raises(DataError, match="outside its folder"):
        _unpack(evil, tmp_path / "into")
    assert not (tmp_path / "escaped.txt").exists()


def test_cli_pull_and_list_against_the_server(fresh_clone: Path, server: DataServer,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    runner = CliRunner()
    monkeypatch.setenv("LEMON_DATA_BASE_URL", server.url)
    result = runner.invoke(app, ["data", "pull", "multiarith"])
    assert result.exit_code == 0, result.output
    assert f"multiarith: pulled 1 file(s), 254.0 kB, sha256 verified: {fresh_clone / 'multiarith'}" in result.output

    result = runner.invoke(app, ["data", "pull", "--config", str(REPO / "configs" / "local-cpu.yaml")])
    assert result.exit_code == 0, result.output
    assert "multiarith: already pulled, sha256 verified" in result.output
    assert len(server.requests) == 1

    listing = runner.invoke(app, ["data", "list"])
    assert listing.exit_code == 0, listing.output
    rows = {line.split()[0]: line for line in listing.output.splitlines()}
    assert f"yes     {fresh_clone / 'multiarith'} (pull cache)" in rows["multiarith"]
    assert "nowhere: run `lemon data pull gsm8k`" in rows["gsm8k"]

    server.mode = "corrupt"
    failed = runner.invoke(app, ["data", "pull", "svamp"])
    assert failed.exit_code == 2
    assert "error:" in failed.output and SOURCES["svamp"].files[0].sha256 in failed.output
    unknown = runner.invoke(app, ["data", "pull", "mmlu", "nosuch"])
    assert unknown.exit_code == 2 and "unknown benchmark 'nosuch'" in unknown.output
    assert not (fresh_clone / "mmlu").exists()  # every name is checked before anything is fetched


def test_ci_workflow_fetches_the_same_files_as_the_pull() -> None:
    """The CI workflow writes its own URL + sha256 list (it runs before lemon is installed); both lists must
    name the same bytes, or CI would test other data than users pull."""
    workflow = (REPO / ".github" / "workflows" / "test.yml").read_text()
    ci = {}
    for line in workflow.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1].startswith("$gh_raw/"):
            ci[parts[0]] = (parts[1].replace("$gh_raw", "https://raw.githubusercontent.com"), parts[2])
    assert len(ci) >= 8
    ours = {f"{name}/{f.dest}": (f.url("https://raw.githubusercontent.com"), f.sha256)
            for name, entry in SOURCES.items() for f in entry.files}
    for path, pinned in ci.items():
        assert ours.get(path) == pinned, path


def test_make_run_pull_fetches_nothing_where_the_data_is_at_hand(tmp_path: Path) -> None:
    """`make run`'s `lemon data pull --config configs/local-cpu.yaml` in a real process on a machine that has
    the data (CI, these machines): it says where the data is and exits 0 without touching the network (the
    base URL is a closed loopback port, so any fetch would fail)."""
    if DATA is None:
        pytest.skip(NO_DATA)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEMON_")}
    env.update(PYTHONPATH=str(REPO), LEMON_CACHE_DIR=str(tmp_path / "cache"), LEMON_DATA_BASE_URL="http://127.0.0.1:9")
    if benchmarks_base.find_shared_datasets() is None:
        env["LEMON_DATA_DIR"] = str(DATA)
    result = subprocess.run([sys.executable, "-m", "lemon_core.cli", "data", "pull", "--config",
                             "configs/local-cpu.yaml"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "multiarith: already available at" in result.stdout and "nothing to pull" in result.stdout
    assert not (tmp_path / "cache").exists()


@pytest.mark.slow
@pytest.mark.integration
def test_a_fresh_clone_without_the_shared_folder_runs_the_main_job_from_pulled_data(
        tmp_path: Path, server: DataServer) -> None:
    """`make run`'s two steps, data then pipeline, in processes of their own with no $LEMON_DATA_DIR and no shared
    folder: the data comes from the loopback server into an empty cache, and the pipeline (CI-sized) runs to the
    report reading it from there."""
    from lemon_core.models import cache_root

    models = cache_root() / "models"
    if not all((models / m).is_dir() for m in ("smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct")):
        pytest.skip("CPU pool models not pulled; run `lemon models pull` (.ci/run does)")
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "models").symlink_to(models)  # the models as `lemon models pull` left them; the data cache empty
    env = {k: v for k, v in os.environ.items() if k != "LEMON_DATA_DIR"}
    env |= {"LEMON_CACHE_DIR": str(cache), "LEMON_DATA_BASE_URL": server.url, "LEMON_SHARED_DATASETS": "off",
            "LEMON_PROGRESS": "off", "OMP_NUM_THREADS": env.get("OMP_NUM_THREADS", "1")}
    lemon = [sys.executable, "-m", "lemon_core.cli"]
    unavailable = subprocess.run([*lemon, "eval", "--benchmark", "multiarith", "--limit", "1"], env=env, cwd=tmp_path,
                                 capture_output=True, text=True, timeout=300)
    assert unavailable.returncode == 2 and "lemon data pull multiarith" in unavailable.stderr  # nothing there yet
    pulled = subprocess.run([*lemon, "data", "pull", "--config", "local-tiny"], env=env, cwd=tmp_path,
                            capture_output=True, text=True, timeout=300)
    assert pulled.returncode == 0, pulled.stderr[-2000:]
    assert "multiarith: pulled" in pulled.stdout and any(r.endswith("MultiArith.json") for r in server.requests)
    run = subprocess.run([*lemon, "pipeline", "run", "--local", "--config", "local-tiny", "--artifacts",
                          str(tmp_path / "runs")], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=1500)
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    assert "report: " in run.stdout and " lemon " in run.stdout
    assert list((tmp_path / "runs").glob("*/report/report.html"))
