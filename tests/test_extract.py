"""Answer extraction from messy model text: numbers and multiple-choice letters."""

from __future__ import annotations

import pytest

from lemon_core.benchmarks.extract import (
    canonical_number,
    extract_choice,
    extract_number,
    numbers_match,
    parse_number,
)

NUMBER_CASES = [
    ("The answer is 42", "42"),
    ("The answer is 42.", "42"),
    ("the answer is: 42", "42"),
    ("Answer: 1,234", "1234"),
    ("So she pays $5.50 in total.", "5.5"),
    ("The answer is $1,234,567.", "1234567"),
    ("Each piece is 12 cm long.", "12"),
    ("He has 5 apples left.", "5"),
    ("The temperature drops to -7 degrees.", "-7"),
    ("The answer is −3", "-3"),
    ("The answer is -$4.", "-4"),
    ("The answer is 0.25", "0.25"),
    ("The answer is .5", "0.5"),
    ("The answer is 3/4", "0.75"),
    ("The answer is \\frac{3}{4}.", "0.75"),
    ("Thus $\\boxed{42}$.", "42"),
    ("\\boxed{\\dfrac{1}{2}}", "0.5"),
    ("\\boxed{1,000}", "1000"),
    ("so \\boxed{\\text{18 dollars}}", "18"),
    ("Natalia sold 48/2 = 24 clips in May.\n#### 72", "72"),
    ("#### 1,000", "1000"),
    ("First 3 + 4 = 7. Then **12**", "12"),
    ("**Step 2:** add 5 and 7 to get 12", "12"),
    ("She earns 10 per hour, works 4 hours, so 40", "40"),
    ("We get 16 - 3 - 4 = 9 eggs, and 9 * 2 = 18 dollars.", "18"),
    ("The answer is 5 + 3 = 8", "8"),
    ("Final answer: 17 marbles", "17"),
    ("The final answer is 100%.", "100"),
    ("The answer is 2.0", "2"),
    ("The answer is 007", "7"),
    ("The answer to the question is 9 because 3*3.", "9"),
    ("The answer is 10. Wait, let me recheck: the answer is 12.", "12"),
    ("Answer = 3.14159", "3.14159"),
    ("It costs €20.", "20"),
    ("It costs $ 3", "3"),
    ("1,2,3 and then 4", "4"),
    ("10 - 5 leaves 5", "5"),
    ("H2O has 3 atoms", "3"),
    ("The result is 64.", "64"),
    ("The answer is 1/0 or 6", "6"),
    ("There are no numbers here", None),
    ("", None),
]


@pytest.mark.parametrize(("text", "expected"), NUMBER_CASES)
def test_extract_number(text: str, expected: str | None) -> None:
    assert extract_number(text) == expected


def test_extract_number_none_input() -> None:
    assert extract_number(None) is None


@pytest.mark.parametrize(
    ("prediction", "gold", "same"),
    [
        ("0.75", "3/4", True),
        ("1234.0", "1,234", True),
        ("18", "18", True),
        ("0.33333", "0.3333", True),  # rel 1e-4 for a decimal gold
        ("18.00001", "18", False),  # integer golds need the integer
        ("1201567", "1201565", False),
        ("18.0000001", "18", True),  # abs 1e-6
        ("18.1", "18", False),
        ("0.0000001", "0", True),  # abs 1e-6
        ("-5", "5", False),
        (None, "5", False),
        ("abc", "5", False),
    ],
)
def test_numbers_match(prediction: str | None, gold: str, same: bool) -> None:
    assert numbers_match(prediction, gold) is same


def test_canonical_number() -> None:
    assert canonical_number(5.0) == "5"
    assert canonical_number("1,234.50") == "1234.5"
    assert canonical_number(-0.5) == "-0.5"
    with pytest.raises(ValueError, match="not a number"):
        canonical_number("five")
    assert parse_number("no digits") is None


OPTIONS = {"A": "Paris", "B": "London", "C": "Berlin", "D": "Madrid"}
NUMERIC_OPTIONS = {"A": "21", "B": "24", "C": "$30.5", "D": "1/2", "E": "None of these"}

CHOICE_CASES = [
    ("The answer is (C)", None, "C"),
    ("The answer is C.", None, "C"),
    ("answer: C", None, "C"),
    ("Answer: (b)", None, "B"),
    ("the answer is (d).", None, "D"),
    ("The correct option is B", None, "B"),
    ("I choose option D.", None, "D"),
    ("Therefore, the answer is **A**.", None, "A"),
    ("\\boxed{B}", None, "B"),
    ("\\boxed{(E)}", None, "E"),
    ("\\boxed{\\text{C}}", None, "C"),
    ("Looking at the options, (A) is wrong, and (C) fits.", None, "C"),
    ("B) is correct", None, "B"),
    ("After checking everything:\nD", None, "D"),
    ("After checking everything:\nd.", None, "D"),
    ("The answer is a number we must compute.", None, None),
    ("The answer is (F)", None, None),
    ("The answer is Berlin.", OPTIONS, "C"),
    ("After comparing, the capital is London", OPTIONS, "B"),
    ("The answer is 24.", NUMERIC_OPTIONS, "B"),
    ("The answer is 30.50 dollars", NUMERIC_OPTIONS, "C"),
    ("The answer is 0.5", NUMERIC_OPTIONS, "D"),
    ("The answer is None of these.", NUMERIC_OPTIONS, "E"),
    ("It is not A, it is not B; the answer is (D)", None, "D"),
    ("", None, None),
]


@pytest.mark.parametrize(("text", "options", "expected"), CHOICE_CASES)
def test_extract_choice(text: str, options: dict[str, str] | None, expected: str | None) -> None:
    assert extract_choice(text, options) == expected


def test_extract_choice_respects_letter_set() -> None:
    assert extract_choice("The answer is (E)", letters="ABCD") is None
    assert extract_choice("The answer is (E)", {"A": "x", "B": "y", "C": "z", "D": "w"}) is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("So 40 sales\nD is the correct choice", "D"),
        ("P(A/B) = 0.16/0.8 = 0.2\nA", "A"),
        ("= 438\nanswer.A", "A"),
        ("9% are left\nD is the answer", "D"),
        ("(4 + 6) = 10 ANS:D", "D"),
        ("x = 15\nAns A", "A"),
        ("The Answer is, B.", "B"),
        ("so (A) is wrong and (B) must be true.", "B"),
        ("Total distance is M+ N\nThus A", "A"),
        ("Therefore A is correct", "A"),
        ("Let's find the answer. A train leaves at 5 pm, so the answer is (B)", "B"),
    ],
)
def test_extract_choice_from_aqua_style_rationales(text: str, expected: str) -> None:
    # shapes taken from the final lines of AQuA's own rationales
    assert extract_choice(text, letters="ABCDE") == expected
