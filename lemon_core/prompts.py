"""Every prompt an executed agent sees, in one place.

An agent's prompt is its role and customised duty (system message), then the task, then the outputs
of the agents it depends on (user message). The agent named as the spec's ``output`` also gets the
benchmark's answer-format instruction, so the team's final answer can be extracted and scored.
"""

from __future__ import annotations

MAX_PARENT_CHARS = 2000  # a parent's output is cut to this many characters before it is passed on

AGENT_SYSTEM = "You are {role}, working as the {base_role} in a small team of AI agents.\nYour duty: {duty}"

AGENT_TASK = "Task:\n{task}"
AGENT_PARENT = "Output of {role} ({agent_id}):\n{output}"
AGENT_FINAL = "You give the team's final answer. {answer_format}"
AGENT_GO = "Now do your duty."


def agent_messages(
    *, role: str, base_role: str, duty: str, task: str,
    parents: list[tuple[str, str, str]], answer_format: str | None,
) -> tuple[str, str]:
    """(system, user) for one agent. ``parents`` is [(agent_id, role, output)] in spec order."""
    system = AGENT_SYSTEM.format(role=role, base_role=base_role, duty=duty)
    parts = [AGENT_TASK.format(task=task)]
    for agent_id, parent_role, output in parents:
        shown = output if len(output) <= MAX_PARENT_CHARS else output[:MAX_PARENT_CHARS] + " [...]"
        parts.append(AGENT_PARENT.format(role=parent_role, agent_id=agent_id, output=shown))
    if answer_format is not None:
        parts.append(AGENT_FINAL.format(answer_format=answer_format).strip())
    parts.append(AGENT_GO)
    return system, "\n\n".join(parts)
