"""Names that configs and the code that reads them share: the orchestrator methods of an evaluation and the
baseline topologies SFT and the teacher sweep vary (``lemon_core.baselines`` builds their specs)."""

ORCHESTRATOR = "lemon"  # method name of the trained orchestrator in evaluation rows (it writes its own specs)
SFT_ORCHESTRATOR = "lemon-sft"  # method name of the SFT-only orchestrator, evaluated beside it
SMALL_TOPOLOGIES = ("cot", "sc", "chain", "tree", "debate")  # baselines.small_topology's names
