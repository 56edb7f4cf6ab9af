"""Role library: the generic base roles an orchestrator's agents inherit from.

Every agent in a spec names a `base_role` from this library and then customises it with a
task-specific `role` and `duty`. The default duty here is what the "roll back duty" counterfactual
edit restores: it keeps the agent's place in the DAG but strips the orchestrator's customisation, so
the reward contrast measures what the customised duty was worth.
"""

from __future__ import annotations

BASE_ROLES: dict[str, str] = {
    "planner": (
        "Break the task into a short numbered plan of concrete steps that the other agents can follow. "
        "Do not solve the task yourself."
    ),
    "solver": (
        "Solve the task step by step, using any plan or intermediate results you are given, "
        "and state the final answer clearly at the end."
    ),
    "verifier": (
        "Check the given solution step by step for errors in reasoning or calculation. "
        "Confirm it if it is correct; otherwise give the corrected final answer."
    ),
    "critic": (
        "Point out the weaknesses, gaps and likely mistakes in the given work, most important first, "
        "and suggest how to fix each one."
    ),
    "coder": (
        "Write correct, self-contained code that solves the task, following any given signature "
        "and plan. Return only the code."
    ),
    "tester": (
        "Think of test cases, including edge cases, for the given code and check it against them. "
        "Report each failing case and how to fix the code."
    ),
    "aggregator": (
        "Combine the answers you are given into one final answer: prefer the answer most of them "
        "support, and resolve disagreements by checking the reasoning."
    ),
    "debater": (
        "Argue for the answer you believe is correct, respond directly to the other agents' "
        "arguments, and change your answer only when they show you are wrong."
    ),
    "summarizer": (
        "Condense the given work into a brief summary that keeps every fact and result needed "
        "for the final answer."
    ),
}

# Base roles whose duty ends in an answer to the task. Such an agent gets the task's answer-format line even
# when it is not the spec's output agent (``executor.build_request``): a chain's solver without it was right on
# 26 of 60 MultiArith problems where the same solver with it was right on 36 (bench/solver_prompt.py). A planner,
# critic, tester, summarizer or coder is not told to end with an answer: its duty asks for something else.
ANSWERING_ROLES: frozenset[str] = frozenset({"solver", "verifier", "aggregator", "debater"})
