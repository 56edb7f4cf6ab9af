"""Pull a final answer (a number or an option letter) out of free-form model text.

Why so many rules: small models rarely follow the format instruction exactly, and a benchmark score
should measure the reasoning, not the formatting. Rules go from most explicit to least:
``\\boxed{}`` -> "the answer is ..." / "answer: ..." -> "#### ..." -> **bold** -> last number (math) or
a lone letter / option text (multiple choice). The *last* explicit statement wins, because models
often restate and correct themselves.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

# sign, optional currency, digits with thousands separators or plain, decimals, optional /denominator
_NUMBER = re.compile(
    r"(?<![\w.])(?P<sign>[-−–]?)(?:[$€£¥]\s?)?(?P<sign2>[-−–]?)"
    r"(?P<num>\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)"
    r"(?:\s?/\s?(?P<den>\d+(?:\.\d+)?))?(?![\d])"
)
_FRAC = re.compile(r"\\[dt]?frac\s*\{\s*([^{}]+?)\s*\}\s*\{\s*([^{}]+?)\s*\}")
_ANSWER_PHRASE = re.compile(
    r"(?:answer|result)(?:\s+to\s+(?:the|this)\s+\w+)?\s*(?:is|would\s+be|will\s+be|should\s+be|[:=])"
    r"\s*(?:[:=]\s*)?",
    re.IGNORECASE,
)
_HASHES = re.compile(r"####\s*")
_BOLD = re.compile(r"\*\*(.+?)\*\*", re.DOTALL)
_BARE_NUMBER = re.compile(r"^\D{0,3}\d[\d,./]*\D{0,15}$")  # "**42**", "**$18.**", "**18 dollars**"


def _boxed_contents(text: str) -> list[str]:
    """Contents of every \\boxed{...} / \\fbox{...}, with nested braces balanced."""
    found = []
    for match in re.finditer(r"\\(?:boxed|fbox)\s*\{", text):
        depth, start = 1, match.end()
        for i in range(start, len(text)):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            if depth == 0:
                found.append(text[start:i])
                break
    return found


def _clean_latex(text: str) -> str:
    text = _FRAC.sub(r"\1/\2", text)
    text = re.sub(r"\\(?:text|mathrm|textbf|mathbf)\s*\{([^{}]*)\}", r"\1", text)
    return text.replace("\\$", "$").replace("\\%", "%").replace("\\,", "").replace("\\!", "")


def canonical_number(value: float | Fraction | int | str) -> str:
    """One spelling per number: integers without ".0", others as a shortest float repr."""
    if isinstance(value, str):
        parsed = parse_number(value)
        if parsed is None:
            raise ValueError(f"not a number: {value!r}")
        value = parsed
    number = float(value)
    if math.isfinite(number) and number == int(number):
        return str(int(number))
    return repr(number)


def parse_number(text: str) -> float | None:
    """The first number in ``text`` as a float ("$1,234.50" -> 1234.5, "3/4" -> 0.75), else None."""
    numbers = _numbers(text)
    return numbers[0] if numbers else None


def _numbers(text: str) -> list[float]:
    values = []
    for m in _NUMBER.finditer(_clean_latex(text)):
        try:
            value = Fraction(m["num"].replace(",", ""))
            if m["den"]:
                den = Fraction(m["den"])
                if den == 0:
                    continue
                value /= den
        except (ValueError, ZeroDivisionError):
            continue
        if (m["sign"] and m["sign"] in "-−–") or m["sign2"]:
            value = -value
        values.append(float(value))
    return values


def _after_phrase(segment: str) -> str:
    """The part of an answer statement that holds the value: up to the line end, after the last '='."""
    line = segment.split("\n", 1)[0]
    if "=" in line:
        line = line.rsplit("=", 1)[1]
    return line


def extract_number(text: str | None) -> str | None:
    """The final numeric answer in ``text`` as a canonical string, or None if there is no number."""
    if not text:
        return None
    for boxed in reversed(_boxed_contents(text)):
        numbers = _numbers(boxed)
        if numbers:
            return canonical_number(numbers[-1])
    text = _clean_latex(text)
    stated = [(m.start(), numbers[0]) for pattern in (_ANSWER_PHRASE, _HASHES) for m in pattern.finditer(text)
              if (numbers := _numbers(_after_phrase(text[m.end():])))]
    if stated:
        return canonical_number(max(stated)[1])
    for match in reversed(list(_BOLD.finditer(text))):
        numbers = _numbers(match.group(1)) if _BARE_NUMBER.match(match.group(1).strip()) else []
        if numbers:
            return canonical_number(numbers[-1])
    numbers = _numbers(text)
    return canonical_number(numbers[-1]) if numbers else None


def numbers_match(prediction: str | None, gold: str, abs_tol: float = 1e-6, rel_tol: float = 1e-4) -> bool:
    """Numeric equality with tolerance, so "0.75" == "3/4" and "1234.0" == "1,234".

    The relative tolerance applies only to non-integer golds (rounded decimals); an integer gold
    needs the integer, else an off-by-two on 1,201,567 would pass at rel 1e-4.
    """
    if prediction is None:
        return False
    predicted, expected = parse_number(prediction), parse_number(gold)
    if predicted is None or expected is None:
        return False
    if expected == int(expected):
        rel_tol = 0.0
    return math.isclose(predicted, expected, rel_tol=rel_tol, abs_tol=abs_tol)


# ---- multiple choice -------------------------------------------------------------------------------

_CHOICE_PHRASE = re.compile(
    r"\b(?:answer|ans|option|choice)\b\s*(?:is|would\s+be|will\s+be|should\s+be)?\s*(?:[:=,]|\.(?=\S))?\s*"
    r"(?:option\s*|choice\s*)?(?::|-(?=\s))?\s*", re.IGNORECASE
)
_LETTER_IS_ANSWER = re.compile(
    r"(?<![\w(])\(?([A-Z])\)?\s+(?:is|must\s+be)\s+(?:the\s+)?"
    r"(?:(?:correct|right|best|final)\s*(?:answer|choice|option)?|answer|choice|option|true)\b"
    r"|\b(?i:thus|therefore|hence|so)\b,?\s+\(?([A-Z])\)?[.!]*\s*$",
    re.MULTILINE,
)


def _letter_at(text: str, letters: str) -> str | None:
    """A letter right at the start of ``text``: "(C)", "C)", "C.", "C" alone, "**C**", lowercase "(c)"."""
    text = text.lstrip(" *_`\"'")
    m = re.match(r"\(\s*([A-Za-z])\s*\)", text) or re.match(r"\\text\{\s*\(?([A-Za-z])\)?\s*\}", text)
    if m and m.group(1).upper() in letters:
        return m.group(1).upper()
    m = re.match(r"([A-Z])(?![\w'])", text)  # uppercase: any non-word follows ("C.", "C)", "C\n", "C")
    if m and m.group(1) in letters:
        return m.group(1)
    m = re.match(r"([a-z])(?:\)|[.:,]?\s*$|[.:,]\s)", text)  # lowercase only when clearly a label
    if m and m.group(1).upper() in letters:
        return m.group(1).upper()
    return None


def _normalise(text: str) -> str:
    return re.sub(r"[\s*_`$\\]+", " ", text).strip(" .").lower()


def _option_by_text(segment: str, options: dict[str, str], strong_only: bool = False) -> str | None:
    """Which option's text ``segment`` states.

    Strong evidence first: the segment *is* an option, or starts with one (longest wins, so
    "A rattling sound" beats an option "A"); then, unless ``strong_only``, the option text mentioned
    last in the segment (the longer one when two end together), then the same number as a numeric
    option ("30.50 dollars" -> "$30.5").
    """
    seg = _normalise(segment)
    normalised = {letter: _normalise(text) for letter, text in options.items()}
    usable = {k: v for k, v in normalised.items() if v and not (len(v) == 1 and v.upper() in options)}
    starts = [(len(opt), letter) for letter, opt in usable.items()
              if seg == opt or (seg.startswith(opt) and not seg[len(opt)].isalnum())]
    if starts:
        return max(starts)[1]
    if strong_only:
        return None
    best: tuple[int, int, str] | None = None  # (end position, length, letter): latest, then longest
    for letter, opt in usable.items():
        pos = seg.rfind(opt) if len(opt) >= 2 else -1
        if pos < 0:
            continue
        end = pos + len(opt)
        if (end == len(seg) or not seg[end].isalnum()) and (pos == 0 or not seg[pos - 1].isalnum()):
            best = max(best or (end, len(opt), letter), (end, len(opt), letter))
    if best:
        return best[2]
    stated = _numbers(segment)
    if stated:
        for letter, option in options.items():
            value = _numbers(option)
            if len(value) == 1 and math.isclose(value[0], stated[-1], rel_tol=1e-4, abs_tol=1e-6):
                return letter
    return None


def extract_choice(
    text: str | None, options: dict[str, str] | None = None, letters: str = "ABCDE"
) -> str | None:
    """The chosen option letter (upper case) in ``text``, or None.

    ``options`` (letter -> option text) lets an answer that states the option's text instead of its
    letter ("The answer is Paris") still count.
    """
    if not text:
        return None
    if options:
        letters = "".join(options)
    for boxed in reversed(_boxed_contents(text)):
        letter = _letter_at(boxed.strip(), letters)
        if letter or (options and (letter := _option_by_text(boxed, options))):
            return letter
    stated = [(m.start(), letter) for m in _LETTER_IS_ANSWER.finditer(text)
              if (letter := m.group(1) or m.group(2)) in letters]
    for match in _CHOICE_PHRASE.finditer(text):
        rest = text[match.end():]
        segment = _after_phrase(rest).split(". ")[0]
        line = rest.split("\n", 1)[0]
        letter = _option_by_text(line, options, strong_only=True) if options else None
        letter = letter or _letter_at(rest, letters)
        if not letter and options:
            letter = _option_by_text(segment, options)
        if letter:
            stated.append((match.start(), letter))
    if stated:
        return max(stated)[1]
    for match in reversed(list(_BOLD.finditer(text))):
        letter = _letter_at(match.group(1).strip(), letters)
        if letter:
            return letter
    last_line = text.strip().rsplit("\n", 1)[-1].strip()
    if options and (letter := _option_by_text(last_line, options, strong_only=True)):
        return letter
    letter = _letter_at(last_line, letters)
    if letter and len(last_line.strip("*_`.() ")) == 1:
        return letter
    candidates = [m for m in re.finditer(r"\(([A-Za-z])\)|(?:^|\s)([A-Z])\)", text)
                  if (m.group(1) or m.group(2)).upper() in letters]
    if candidates:
        m = candidates[-1]
        return (m.group(1) or m.group(2)).upper()
    if options:
        return _option_by_text(last_line, options)
    return None
