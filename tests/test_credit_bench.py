"""bench/credit.py's measurements: the policy's own probability of each (solver, checker) pair's spec, and the
rollouts' reward without the simulated pool's draws (E[reward | spec, task]), which its headline metric reads."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch

from lemon_core.backends.simulated import register_examples
from lemon_core.config import RewardConfig, SFTConfig
from lemon_core.policy import OrchestratorPolicy, spec_completion
from lemon_core.pool import load_pool
from lemon_core.reward import RewardTerms
from lemon_core.rollout import RolloutRecord
from lemon_core.sft import sft_train

sys.path.insert(0, str(Path(__file__).parent))
from bench_modules import load_bench  # noqa: E402
from tiny_models import build_tiny_chat_model  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def _credit() -> ModuleType:
    return load_bench("credit.py", "credit_bench")


@pytest.fixture
def one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_pair_choice_follows_what_the_policy_was_taught(tmp_path: Path, one_thread: None) -> None:
    credit = _credit()
    policy = OrchestratorPolicy.load(str(build_tiny_chat_model(tmp_path / "tiny", seed=0)),
                                     include_roles=False, include_format=False)
    pool = load_pool("simulated")
    tasks = credit.make_tasks(3)
    before = credit.pair_choice(policy, pool, tasks, temperature=0.7)
    assert set(before) == set(credit.PAIRS) and 0 <= sum(before.values()) < 0.01  # untrained: writes no spec

    # teach (large, small) twice as often as (medium, medium): the choice follows, and nothing else is chosen
    taught = [("large", "small"), ("large", "small"), ("medium", "medium")]
    pairs = [(t.question, spec_completion(credit.solve_check_spec(*pair))) for t in tasks for pair in taught]
    sft_train(policy, pairs, pool, SFTConfig(steps=60, batch_size=3, lr=3e-3), seed=0)
    after = credit.pair_choice(policy, pool, tasks, temperature=0.7)
    others = [after[p] for p in credit.PAIRS if p not in taught]
    assert after[("large", "small")] > after[("medium", "medium")] > max(others)
    assert (after[("large", "small")] + after[("medium", "medium")]) / sum(after.values()) > 0.8
    assert sum(after.values()) > 100 * sum(before.values())
    per_task = [credit.pair_choice(policy, pool, [t], temperature=0.7) for t in tasks]
    assert after == pytest.approx({p: sum(c[p] for c in per_task) / 3 for p in credit.PAIRS}, abs=1e-5)


def test_expected_reward_drops_the_pool_draws_and_keeps_the_invalid_penalty(tmp_path: Path) -> None:
    credit = _credit()
    from lemon_core.rollout import write_records

    tasks = credit.make_tasks(2)
    register_examples(tasks)
    rewards = credit.SpecRewards(RewardConfig(lambda_cost=1.0), draws=30)
    credit.pair_rewards(tasks, rewards)  # raises SystemExit unless (large, small) is the best pair
    best, cheap = credit.solve_check_spec("large", "small"), credit.solve_check_spec("small", "small")

    def record(task, spec, reward: float) -> RolloutRecord:  # noqa: ANN001
        return RolloutRecord(step=1, task_id=task.id, benchmark=task.benchmark, sample=0, prompt_ids=[1],
                             completion_ids=[2], old_logprobs=[0.0], offsets=[(0, 1)], temperature=0.7, text="x",
                             valid=spec is not None, spec=spec.model_dump() if spec else None,
                             reward=RewardTerms(success=reward, total=reward))

    # what the pool happened to draw (here: the best spec failed, the cheap one succeeded) does not count
    rows = [record(tasks[0], best, -0.3), record(tasks[1], cheap, 0.9), record(tasks[0], None, -1.0)]
    write_records(rows, str(tmp_path / "rollouts" / "step-000001-rank0.jsonl"))
    [records] = credit.saved_rollouts(tmp_path, 1)
    step1 = credit.expected_reward(records, {t.id: t for t in tasks}, rewards)
    assert step1 == pytest.approx((rewards(best, tasks[0]) + rewards(cheap, tasks[1]) - 1.0) / 3)
    assert rewards(best, tasks[0]) > 0.5 > rewards(cheap, tasks[1])


@pytest.mark.slow
def test_bench_runs_end_to_end_and_merge_prints_the_same_ratio(tmp_path: Path) -> None:
    """A 1-seed, 2-step run of the whole script (its SFT cut to 20 steps), then --merge of what it wrote; then each
    arm alone (--arms), merged by arm."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = subprocess.run(
        [sys.executable, str(REPO / "bench" / "credit.py"), "--seeds", "1", "--steps", "2", "--window", "1",
         "--sft-steps", "20", "--sft-cache", str(tmp_path / "sft"), "--json", str(tmp_path / "run.json")],
        capture_output=True, text=True, env=env, timeout=600, check=False,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    lines = run.stdout.strip().splitlines()
    assert re.fullmatch(r"ratio=\d+\.\d{3}", lines[-1]) and lines[-2].startswith("raw_ratio=")
    assert sum(line.startswith("seed=0 ") for line in lines) == 2  # both arms
    merged = subprocess.run([sys.executable, str(REPO / "bench" / "credit.py"), "--merge", str(tmp_path / "run.json")],
                            capture_output=True, text=True, env=env, timeout=120, check=False)
    assert merged.returncode == 0, merged.stderr[-2000:]
    assert merged.stdout.strip().splitlines()[-2:] == lines[-2:]

    # One arm per run: the GRPO arm alone with other counterfactual options (which it ignores: bench/credit.py's
    # ARM_ONLY; its group size is derived from --edits unless given, so it is given here) writes the same curves,
    # and the cf arm alone merged with the first run's GRPO arm gives its ratio.
    def one_arm(arm: str, name: str, *options: str) -> dict:
        alone = subprocess.run(
            [sys.executable, str(REPO / "bench" / "credit.py"), "--seeds", "1", "--steps", "2", "--window", "1",
             "--sft-steps", "20", "--sft-cache", str(tmp_path / "sft"), "--json", str(tmp_path / name),
             "--arms", arm, *options], capture_output=True, text=True, env=env, timeout=600, check=False)
        assert alone.returncode == 0, alone.stderr[-2000:]
        assert alone.stdout.strip().splitlines()[-1].startswith(f"no ratio: the {arm} arm only")
        return json.loads((tmp_path / name).read_text())["results"]

    first = json.loads((tmp_path / "run.json").read_text())["results"]
    grpo_alone = one_arm("grpo", "grpo.json", "--families", "all", "--edits", "3", "--cf-max-ratio", "2",
                         "--cf-coef", "1", "--grpo-group-size", "15")
    assert list(grpo_alone) == ["grpo"] and grpo_alone["grpo"][0]["seed"] == 0
    for key in ("curve", "expected_curve", "optimal_share", "valid", "optimal_prob"):
        assert grpo_alone["grpo"][0][key] == first["grpo"][0][key], key
    cf_alone = one_arm("grpo+cf", "cf.json")  # the cf arm alone: the same curves as beside the GRPO arm
    for key in ("curve", "expected_curve", "optimal_share", "valid", "optimal_prob"):
        assert cf_alone["grpo+cf"][0][key] == first["grpo+cf"][0][key], key
    by_arm = subprocess.run([sys.executable, str(REPO / "bench" / "credit.py"), "--merge",
                             f"{tmp_path / 'run.json'}:grpo", str(tmp_path / "cf.json")],
                            capture_output=True, text=True, env=env, timeout=120, check=False)
    assert by_arm.returncode == 0, by_arm.stderr[-2000:]
    assert by_arm.stdout.strip().splitlines()[-2:] == lines[-2:]


def test_the_credit_formulas_set_the_floor_and_the_cap() -> None:
    """--credit legacy is the paper's formula whatever --std-floor and --cf-max-ratio say (no floor, no cap); the
    calibrated one passes them on, a --cf-max-ratio <= 0 meaning no cap. Both give GRPOConfig fields it accepts."""
    credit = _credit()
    args = argparse.Namespace(credit="legacy", std_floor=0.05, cf_max_ratio=2.0)
    assert credit._credit_overrides(args) == {"std_floor": 0.0, "cf_max_ratio": None}
    args.credit = "calibrated"
    assert credit._credit_overrides(args) == {"std_floor": 0.05, "cf_max_ratio": 2.0}
    args.cf_max_ratio = 0.0
    assert credit._credit_overrides(args) == {"std_floor": 0.05, "cf_max_ratio": None}
    for formula in ("legacy", "calibrated"):
        args.credit = formula
        cfg = credit.GRPOConfig(**credit._credit_overrides(args))
        assert (cfg.std_floor, cfg.cf_max_ratio) == tuple(credit._credit_overrides(args).values())


@pytest.mark.parametrize("option", ["--edit-choice", "--null-resets", "--span-credit", "--cf-weight", "--drop-uniform",
                                    "--scale-rewards", "--no-scale-rewards"])
def test_options_of_deleted_switches_are_gone(option: str, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """The switches measured to give nothing were deleted from the trainer; the bench no longer offers them."""
    monkeypatch.setattr(sys, "argv", ["credit.py", option])
    with pytest.raises(SystemExit) as exit_info:
        _credit().main()
    assert exit_info.value.code == 2 and f"unrecognized arguments: {option}" in capsys.readouterr().err


def test_sft_on_teaches_one_assignment_and_is_checked_against_the_chain(monkeypatch: pytest.MonkeyPatch,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """--sft-on gives SFT one capacity assignment (a collapsed start) instead of all 9; a level that is not the
    pool's, or a count that does not fit --checkers, is refused by name."""
    credit = _credit()
    uniform = credit.sft_assignments(argparse.Namespace(sft_on=None, checkers=1))
    assert len(uniform) == 9 and ("large", "small") in uniform
    assert credit.sft_assignments(argparse.Namespace(sft_on=("large", "large"), checkers=1)) == [("large", "large")]
    assert credit.parse_assignment("large, small") == ("large", "small")
    with pytest.raises(argparse.ArgumentTypeError, match="'large,huge': give capacities from"):
        credit.parse_assignment("large,huge")
    monkeypatch.setattr(sys, "argv", ["credit.py", "--sft-on", "large,large", "--checkers", "3"])
    with pytest.raises(SystemExit) as exit_info:
        credit.main()
    assert exit_info.value.code == 2 and "give 4 capacities" in capsys.readouterr().err


def test_prices_make_a_family_where_the_target_needs_the_optimal_pair(tmp_path: Path) -> None:
    """--prices rewrites the simulated pool's prices (output twice the input): with the shipped ones a non-optimal
    pair, (large, medium), clears 90% of r*, so the steps-to-target metric never needed the checker's capacity;
    with a dearer `medium` (100,600,1000) every other pair stays below it and the optimum is unchanged."""
    credit = _credit()
    assert credit.bench_pool(None, False, tmp_path) == "simulated"
    path = credit.bench_pool([100.0, 600.0, 1000.0], False, tmp_path / "pool")
    priced, shipped = load_pool(path), load_pool("simulated")
    assert [(lv.price_in_per_1m, lv.price_out_per_1m) for lv in priced.levels] == [
        (100.0, 200.0), (600.0, 1200.0), (1000.0, 2000.0)]
    assert [lv.model_dump(exclude={"price_in_per_1m", "price_out_per_1m"}) for lv in priced.levels] == [
        lv.model_dump(exclude={"price_in_per_1m", "price_out_per_1m"}) for lv in shipped.levels]
    with pytest.raises(SystemExit, match="3 numbers"):
        credit.bench_pool([100.0, 600.0], False, tmp_path / "bad")
    with pytest.raises(argparse.ArgumentTypeError, match="three numbers"):
        credit.parse_prices("100,six hundred,1000")

    tasks = credit.make_tasks(6)
    register_examples(tasks)
    runner_up = {}
    for name, pool in (("shipped", "simulated"), ("priced", path)):
        table = credit.pair_rewards(tasks, credit.SpecRewards(RewardConfig(lambda_cost=1.0), pool_source=pool))
        runner_up[name] = credit.runner_up(table)  # pair_rewards exits unless (large, small) is still the best
    assert runner_up["shipped"] >= 0.9 > runner_up["priced"]


def test_a_chain_of_checkers_has_one_capacity_per_agent_to_get_right(tmp_path: Path) -> None:
    """--checkers 3: a solver and three checkers in a chain, 81 capacity assignments. Under the priced pool the best
    is still a `large` solver with `small` checkers and no other assignment clears 90% of r* (so reaching the target
    needs all four capacities right); under the shipped prices a `medium` solver with `medium` checkers comes within
    1% of it, which is why the family is run priced. The share of sampled specs at the optimum counts all four."""
    credit = _credit()
    spec = credit.solve_check_spec("large", "small", "medium", "small")
    assert [(a.id, a.capacity, a.depends_on) for a in spec.agents] == [
        ("a1", "large", []), ("a2", "small", ["a1"]), ("a3", "medium", ["a2"]), ("a4", "small", ["a3"])]
    assert spec.output == "a4" and credit.solve_check_spec("large", "small") == credit.solve_check_spec(*credit.OPTIMUM)
    assignments = credit.capacity_assignments(3)
    assert len(set(assignments)) == len(assignments) == 81 and credit.optimum(3) == ("large", "small", "small", "small")

    tasks = credit.make_tasks(6)
    register_examples(tasks)
    priced = credit.bench_pool([100.0, 600.0, 1000.0], False, tmp_path / "pool")
    runner_up = {}
    for name, pool in (("shipped", "simulated"), ("priced", priced)):
        table = credit.pair_rewards(tasks, credit.SpecRewards(RewardConfig(lambda_cost=1.0), pool_source=pool), 3)
        assert set(table) == set(assignments)  # pair_rewards exits unless optimum(3) is the best
        runner_up[name] = credit.runner_up(table)
    assert runner_up["shipped"] > 0.99 and runner_up["priced"] < 0.9

    def record(levels: tuple[str, ...]) -> RolloutRecord:
        return RolloutRecord(step=1, task_id="sc0", benchmark="solve_check", sample=0, prompt_ids=[1],
                             completion_ids=[2], old_logprobs=[0.0], offsets=[(0, 1)], temperature=0.7, text="x",
                             valid=True, spec=credit.solve_check_spec(*levels).model_dump(),
                             reward=RewardTerms(success=0.0, total=0.0))

    records = [record(credit.optimum(3)), record(("large", "small", "small", "medium")), record(credit.optimum(3))]
    assert credit.optimal_share(records, credit.optimum(3)) == pytest.approx(2 / 3)
    assert credit.optimal_share([record(credit.OPTIMUM)]) == 1.0  # one checker by default
    result = subprocess.run([sys.executable, str(REPO / "bench" / "credit.py"), "--checkers", "0"],
                            capture_output=True, text=True)
    assert result.returncode == 2 and "--checkers 0: give 1 or more" in result.stderr


def test_coupled_draws_reach_every_level_of_the_bench_pool_and_change_nothing_else(tmp_path: Path) -> None:
    """--coupled-draws gives every level's backend coupled_draws (alone or with --prices); prices, accuracies and
    the other options stay the shipped ones."""
    credit = _credit()
    for prices in (None, [100.0, 600.0, 1000.0]):
        pool = load_pool(credit.bench_pool(prices, True, tmp_path / str(prices)))
        assert all(pool.backend(lv.name).coupled_draws for lv in pool.levels)
        plain = load_pool(credit.bench_pool(prices, False, tmp_path / f"plain-{prices}"))
        assert not any(plain.backend(lv.name).coupled_draws for lv in plain.levels)
        assert [lv.model_dump(exclude={"options"}) for lv in pool.levels] == [
            lv.model_dump(exclude={"options"}) for lv in plain.levels]
        assert [{k: v for k, v in lv.options.items() if k != "coupled_draws"} for lv in pool.levels] == [
            lv.options for lv in plain.levels]


def _fake_run(steps: int, calls_per_step: int = 10, horizon: int = 80, **extra: object) -> dict:
    """A run that reached the target at ``steps`` (horizon + 1: never), running ``calls_per_step`` calls a step."""
    return {"steps_to_target": steps, "raw_steps_to_target": steps, "curve": [0.5], "expected_curve": [0.5],
            "optimal_share": [0.5], "valid": [1.0], "optimal_prob": [0.1], "calls": [calls_per_step] * horizon,
            **extra}


def test_calls_to_target_counts_the_calls_that_ran_and_censors_like_steps() -> None:
    credit = _credit()
    run = {"calls": [4, 10, 6], "steps_to_target": 2, "raw_steps_to_target": 4}
    assert credit.calls_to_target(run) == 14  # steps 1 and 2
    assert credit.calls_to_target(run, "raw_steps_to_target") == 4 + 10 + 6 + 6  # never: the horizon + one step
    # the budget of a seed is its dearest arm's: a collapsed arm that never gets there (its identical specs share
    # their calls) is not cheaper than one that does
    cheap = {"seed": 1, "calls": [1, 1, 1], "steps_to_target": 4}
    dear = {"seed": 1, "calls": [9, 9, 9], "steps_to_target": 2}
    budget = credit.budgets({"grpo": [cheap], "grpo+cf": [dear]})
    assert budget == {1: 36.0}
    assert credit.arm_calls([cheap, dear], budget) == [36.0, 18.0]


def _lines(credit: ModuleType, capsys: pytest.CaptureFixture, results: dict, collapsed: bool) -> list[str]:
    credit.summarize(results, 80, 1, collapsed=collapsed)
    return capsys.readouterr().out.strip().splitlines()


def test_the_targets_say_not_met_when_nothing_was_learned(capsys: pytest.CaptureFixture) -> None:
    """16 held-out seeds where the cf arm is GRPO's twin (same steps, same calls), none of them reaching 90% of r*
    within the horizon: both targets are "not met", and the ratio is 1."""
    credit = _credit()
    never = [_fake_run(81, seed=32 + i) for i in range(16)]
    out = _lines(credit, capsys, {"grpo": never, "grpo+cf": [dict(r) for r in never]}, collapsed=True)
    assert out[-1] == "ratio=1.000"
    assert "target grpo+cf: calls ratio <= 0.75 on held-out seeds: not met (ratio 1.000, 95% interval " \
           "[1.000, 1.000], n=16)" in out
    assert any(line.startswith("target grpo+cf: collapsed start reaches 90% of r* on >= 12/16 held-out seeds: not "
                               "met (reached within 80 steps: grpo 0/16, grpo+cf 0/16)") for line in out)
    assert "== held-out seeds (>= 32)" in out and "== tuning seeds (< 32)" not in out


def test_the_targets_say_met_when_the_cf_arm_learned_in_fewer_calls(capsys: pytest.CaptureFixture) -> None:
    """The grpo arm runs more calls per step (its larger group) and never gets there; the cf arm gets there at step
    20 on 12 of 16 held-out seeds, and a censored run counts its seed's budget (81 · 15, the grpo arm's):
    (12 · 20 · 10 + 4 · 81 · 15) / (16 · 81 · 15) = 0.373 <= 0.75, and 12/16 is met.
    Tuning seeds (< 32) are summarised apart and do not count: there the cf arm never gets there."""
    credit = _credit()
    grpo = [_fake_run(81, calls_per_step=15, seed=32 + i) for i in range(16)]
    cf = [_fake_run(20 if i < 12 else 81, seed=32 + i) for i in range(16)]
    tuning_grpo = [_fake_run(10, seed=i) for i in range(2)]
    tuning_cf = [_fake_run(81, seed=i) for i in range(2)]
    out = _lines(credit, capsys, {"grpo": tuning_grpo + grpo, "grpo+cf": tuning_cf + cf}, collapsed=True)
    ratio = (12 * 20 * 10 + 4 * 81 * 15) / (16 * 81 * 15)
    assert out[-1] == f"ratio={ratio:.3f}"
    assert any(line.startswith(f"target grpo+cf: calls ratio <= 0.75 on held-out seeds: met (ratio {ratio:.3f}")
               for line in out)
    assert any(line.startswith("target grpo+cf: collapsed start reaches 90% of r* on >= 12/16 held-out seeds: met "
                               "(reached within 80 steps: grpo 0/16, grpo+cf 12/16)") for line in out)
    tuning = out.index("== tuning seeds (< 32)")
    held = out.index("== held-out seeds (>= 32)")
    assert tuning < held and any(line.startswith("grpo+cf   calls_to_90%: 810 ") for line in out[tuning:held])
    # 11 of 16 is one short; 15 seeds are too few to judge
    short = [_fake_run(20 if i < 11 else 81, seed=32 + i) for i in range(16)]
    out = _lines(credit, capsys, {"grpo": grpo, "grpo+cf": short}, collapsed=True)
    assert any("collapsed start" in line and ": not met (" in line for line in out)
    out = _lines(credit, capsys, {"grpo": grpo[:15], "grpo+cf": cf[:15]}, collapsed=True)
    assert any("collapsed start" in line and ": not measured (" in line for line in out)


def test_merge_refuses_runs_of_different_settings_or_repeated_seeds(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture) -> None:
    credit = _credit()

    def write(name: str, first_seed: int, **settings: object) -> Path:
        args = {"steps": 1, "window": 1, "lr": 2e-4, "prices": None, "seeds": 1, "first_seed": first_seed,
                "sft_cache": f"/tmp/{name}", "json": name} | settings
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps({"r_star": 0.6, "args": args,
                                    "results": {"grpo": [_fake_run(4)], "grpo+cf": [_fake_run(3)]}}))
        return path

    a, b = write("a", 0), write("b", 1)  # differ only in seeds, SFT cache and output file: one run
    credit.merge([a, b])
    assert capsys.readouterr().out.strip().splitlines()[-1] == "ratio=0.750"
    with pytest.raises(SystemExit, match="differ in prices"):
        credit.merge([a, write("c", 2, prices=[100.0, 600.0, 1000.0])])
    with pytest.raises(SystemExit, match=r"seeds \[0\] are in more than one file"):
        credit.merge([a, write("d", 0)])
    with pytest.raises(SystemExit, match="differ in a_later_option"):  # no list of options to keep up to date
        credit.merge([a, write("e", 3, a_later_option=True)])
    # a file of an older bench that recorded a switch since deleted: refused by name, even at its old default
    with pytest.raises(SystemExit, match=r"f\.json was written by an older bench/credit.py .*\(edit_choice, "
                                         r"null_resets\); re-run it"):
        credit.merge([a, write("f", 4, edit_choice="family", null_resets=False)])


def test_merge_pairs_one_arm_of_a_file_with_an_arm_run_alone(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """``FILE:ARM`` takes one arm of a file, so a grpo+cf arm run alone (``--arms grpo+cf``) with other cf options
    pairs with an earlier run's GRPO arm; options that change the GRPO arm too must still agree, and both arms
    must hold the same seeds (the differences are paired by seed, whatever the order of the files)."""
    credit = _credit()

    def write(name: str, results: dict, first_seed: int = 0, **settings: object) -> Path:
        args = {"steps": 4, "window": 1, "lr": 2e-4, "cf_max_ratio": 0.5, "families": "paper", "seeds": 2,
                "first_seed": first_seed, "json": name} | settings
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps({"r_star": 0.6, "args": args, "results": results}))
        return path

    def run(steps: int, reward: float, **seed: int) -> dict:
        return {**_fake_run(steps), "expected_curve": [reward], **seed}

    both = write("both", {"grpo": [run(4, 0.1), run(2, 0.5)], "grpo+cf": [run(5, 0.0), run(5, 0.0)]})
    cf_alone = write("cf", {"grpo+cf": [run(3, 0.6, seed=1), run(1, 0.2, seed=0)]},
                     arms=["grpo+cf"], cf_max_ratio=2.0, families="all", edits=3)
    credit.merge([f"{both}:grpo", cf_alone])
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-1] == "ratio=0.667"  # (1 + 3) / (4 + 2)
    # paired by seed: 0.2 - 0.1 and 0.6 - 0.5 (in file order it would be 0.6 - 0.1 and 0.2 - 0.5: ahead on 1/2)
    assert any(line.startswith("paired cf - grpo expected reward") and "+0.100 ± 0.000" in line
               and line.endswith("cf ahead on 2/2 seeds") for line in out)
    with pytest.raises(SystemExit, match="differ in cf_max_ratio"):  # the whole file: its cf arm had ρ = 0.5
        credit.merge([both, cf_alone])
    with pytest.raises(SystemExit, match="differ in lr"):  # lr moves the GRPO arm too
        credit.merge([f"{both}:grpo", write("cf_lr", {"grpo+cf": [_fake_run(3), _fake_run(1)]}, lr=1e-4)])
    with pytest.raises(SystemExit, match="arms hold different seeds"):
        credit.merge([f"{both}:grpo", write("cf_late", {"grpo+cf": [_fake_run(3), _fake_run(1)]}, first_seed=1)])
    with pytest.raises(SystemExit, match="holds no grpo arm; it holds grpo\\+cf$"):
        credit.merge([f"{cf_alone}:grpo"])
    with pytest.raises(SystemExit, match="'cf' is not an arm"):  # a mistyped arm is named, not a missing file
        credit.merge([f"{both}:cf"])
    with pytest.raises(SystemExit, match="holds no run of any arm; it holds no runs"):
        credit.merge([write("empty", {"grpo": [], "grpo+cf": []})])
    credit.merge([cf_alone])  # one arm alone: its line, and why there is no ratio
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-1].startswith("no ratio: the grpo+cf arm only")
    assert not any(line.startswith("ratio=") for line in out)


def test_sft_cache_is_reused_only_for_the_prices_and_settings_it_was_trained_with(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The orchestrator's prompt lists the levels' prices, so an SFT model warmed on the shipped pool is out of
    distribution under --prices (44% invalid specs before any GRPO step): reusing such a cache is refused, and so
    is one trained with other SFT steps. The marker is written before training (a run that dies after saving the
    model leaves a marked cache)."""
    credit = _credit()
    trained: list[Path] = []

    def fake_sft(cfg: object, **_: object) -> None:  # what train() leaves behind, without the training
        where = Path(cfg.out)
        assert (where / "sft-marker.json").exists()
        (where / "sft-model").mkdir()
        trained.append(where)

    monkeypatch.setattr(credit, "train", fake_sft)
    args = argparse.Namespace(tasks_per_step=2, group_size=6, max_new_tokens=200, temperature=0.7, grammar=True,
                              sft_steps=400, sft_seed=0, lambda_cost=1.0, lr=2e-4, epochs=1, level_tokens="whole",
                              checkers=1, sft_on=None)
    priced = credit.bench_pool([100.0, 600.0, 1000.0], False, tmp_path / "pool")

    def sft(cache: Path, pool: str, **changes: object) -> Path:
        run_args = argparse.Namespace(**{**vars(args), **changes})
        return credit.sft_once(tmp_path / "m", tmp_path / "t.jsonl", credit.make_tasks(2), [], run_args, cache, pool)[0]

    assert sft(tmp_path / "priced", priced) == tmp_path / "priced" / "sft-model" and len(trained) == 1
    assert sft(tmp_path / "priced", priced) == tmp_path / "priced" / "sft-model" and len(trained) == 1  # reused
    for pool, changes in (("simulated", {}), (priced, {"sft_steps": 100}), (priced, {"sft_seed": 1}),
                          (priced, {"level_tokens": "split"}), (priced, {"checkers": 3}),
                          (priced, {"sft_on": ("large", "large")})):
        with pytest.raises(SystemExit, match="give a new folder"):
            sft(tmp_path / "priced", pool, **changes)
    old_marker = tmp_path / "old-marker"  # a marker from before --checkers: one checker
    assert sft(old_marker, priced) == old_marker / "sft-model" and len(trained) == 2
    marker = json.loads((old_marker / "sft-marker.json").read_text())
    (old_marker / "sft-marker.json").write_text(json.dumps({k: v for k, v in marker.items()
                                                           if k not in ("checkers", "sft_on")}))
    assert sft(old_marker, priced) == old_marker / "sft-model" and len(trained) == 2
    with pytest.raises(SystemExit, match="give a new folder"):
        sft(old_marker, priced, checkers=3)

    legacy = tmp_path / "legacy"  # a cache from before the marker: the shipped pool, the split tokenizer
    (legacy / "sft-model").mkdir(parents=True)
    assert sft(legacy, "simulated", level_tokens="split") == legacy / "sft-model" and len(trained) == 2
    for pool, changes in ((priced, {"level_tokens": "split"}), ("simulated", {})):
        with pytest.raises(SystemExit, match="give a new folder"):
            sft(legacy, pool, **changes)


def test_the_policy_writes_each_capacity_level_as_one_token_as_real_tokenizers_do(tmp_path: Path) -> None:
    """The span term acts on the capacity value's tokens. Split into character tokens (the tiny tokenizer's own
    merges), those tokens are shared with the role and duty text, so a span's advantage moves them too; Qwen2.5's
    and SmolLM2's tokenizers write ' small', ' medium' and ' large' as one token each, and so does the bench's."""
    from transformers import AutoTokenizer

    credit = _credit()
    text = spec_completion(credit.solve_check_spec("large", "small")) + spec_completion(
        credit.solve_check_spec("medium", "medium"))
    for level_tokens in ("whole", "split"):
        path = build_tiny_chat_model(tmp_path / level_tokens, seed=0, whole_words=credit.level_words(level_tokens))
        tokenizer = AutoTokenizer.from_pretrained(path)
        pieces = [tokenizer.decode([i]) for i in tokenizer(text, add_special_tokens=False)["input_ids"]]
        assert "".join(pieces) == text
        levels = [p for p in pieces if p.strip() in credit.LEVELS]
        if level_tokens == "whole":
            assert levels == [" large", " small", " medium", " medium"]
        else:
            assert levels == [] and "l" in pieces
    with pytest.raises(ValueError, match="raise it"):
        build_tiny_chat_model(tmp_path / "few", whole_words=(" large", " medium", " small"), vocab_size=262)


def test_the_ratio_interval_resamples_seeds_in_pairs(capsys: pytest.CaptureFixture) -> None:
    """The bootstrap draws whole seeds (both arms): arms that differ by a constant factor on every seed give that
    factor as both ends, however wide the spread between seeds; unpaired resampling would not. A mixed case
    brackets the point ratio, and the summary prints the interval and the paired step difference."""
    credit = _credit()
    grpo = [10, 80, 20, 40]
    assert credit.ratio_interval(grpo, [s // 2 for s in grpo]) == (0.5, 0.5)
    cf = [12, 30, 20, 20]
    low, high = credit.ratio_interval(grpo, cf)
    assert low < sum(cf) / sum(grpo) < high and high - low > 0.1
    assert credit.ratio_interval(grpo, cf) == (low, high)  # seeded: the same interval every run
    credit.summarize({"grpo": [_fake_run(s) for s in grpo], "grpo+cf": [_fake_run(s) for s in cf]}, 80, 1)
    out = capsys.readouterr().out
    assert ("paired cf - grpo steps_to_90%: -17.00 ± 12.07 (s.e.); calls ratio 95% interval "
            f"[{low:.3f}, {high:.3f}]") in out
    assert out.strip().splitlines()[-1] == "ratio=0.547"
