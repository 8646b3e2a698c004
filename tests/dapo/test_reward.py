"""dapo.reward: the paper's DAPO math scorer, hand-worked, on real AIME 2024 answers, against verl 0.9.1.

References used here:
* "paper": the authors' eval/math_dapo.py (BytedTsinghua-SIA/DAPO) with its default strict_box_verify=False,
  i.e. is_correct_minerva on the last 300 characters. verl 0.9.1's normalize_final_answer and
  is_correct_minerva are the same code (diffed: whitespace only), so verl's functions stand in for it.
* "verl": verl 0.9.1's math_dapo.compute_score, which adds a \\boxed{} fallback.
"""

from __future__ import annotations

import concurrent.futures
import importlib.metadata
import importlib.util
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo import reward
from dapo.reward import INVALID, compute_score, normalize_final_answer

AIME_PARQUET = Path(__file__).resolve().parents[1] / "data" / "aime-2024.parquet"


@pytest.fixture(scope="module")
def verl_math_dapo():
    """verl 0.9.1's installed verl/utils/reward_score/math_dapo.py, executed as is.

    Loaded from its file rather than through `import verl...`: verl's package __init__ imports torch,
    tensordict and plugins (8-25 s here) and nothing of it reaches this module, which imports only `re`.
    """
    if "verl.utils.reward_score.math_dapo" in sys.modules:
        return sys.modules["verl.utils.reward_score.math_dapo"]
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("verl is not installed")
    assert importlib.metadata.version("verl") == "0.9.1", "these agreement tests are written against verl 0.9.1"
    path = Path(spec.submodule_search_locations[0]) / "utils" / "reward_score" / "math_dapo.py"
    module_spec = importlib.util.spec_from_file_location("verl_math_dapo_under_test", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


def paper_score(verl_math_dapo, solution: str, ground_truth: str) -> dict:
    """The authors' compute_score(solution, ground_truth) (strict_box_verify=False), through verl's copy."""
    correct, pred = verl_math_dapo.is_correct_minerva(solution[-300:], ground_truth)
    return {"score": 1.0 if correct else -1.0, "acc": correct, "pred": pred}


def score(solution, ground_truth, **kwargs) -> float:
    return compute_score("math_dapo", solution, ground_truth, **kwargs)["score"]


# ------------------------------------------------------------------------------------------------
# Hand-worked cases: (response, ground truth, expected score, why)
# ------------------------------------------------------------------------------------------------
HAND_WORKED = [
    ("Answer: 204", "204", 1.0, "extracted '204'; both sides normalise to '204'"),
    ("answer : $204$", "204", 1.0, "(?i) and \\s* around the colon; '$204$' keeps the span between the $"),
    ("Answer: \\boxed{204}", "204", 1.0, "\\boxed{...} is unwrapped up to the last '}'"),
    ("Answer: $\\boxed{204}$", "204", 1.0, "$..$ span, then \\boxed unwrapped, then $ dropped"),
    ("Answer: 204.", "204", -1.0, "'204.' stays '204.': a period is only dropped right before a '$'"),
    ("Answer: $204.$", "204", 1.0, "'.$' -> '$' (first substitution that applies), then '$204$' -> '204'"),
    ("Answer: x = 204", "204", 1.0, "only the text after the last '=' is kept, spaces removed"),
    ("Answer: 1,000", "1000", 1.0, "'1,000' without commas is all digits, so the commas go"),
    ("Answer: 1,000.5", "1000.5", -1.0, "'1000.5' is not all digits, so the commas stay: '1,000.5' != '1000.5'"),
    ("Answer: 90^\\circ", "90", 1.0, "'^\\circ' is a removed expression"),
    ("Answer: 5 units", "5", 1.0, "spaces removed -> '5units', then 'units' removed"),
    ("Answer: a 204", "204", 1.0, "the substitution 'a ' -> '' fires on the article"),
    ("Answer: \\frac12", "\\frac{1}{2}", 1.0, "shorthand \\fracab -> \\frac{a}{b}"),
    ("Answer: \\sqrt2", "\\sqrt{2}", 1.0, "shorthand \\sqrta -> \\sqrt{a}"),
    ("Answer: \\text{(B)}", "(B)", 1.0, "\\text{...} unwrapped up to the first '}'"),
    ("Answer: **204**", "204", -1.0, "markdown bold is not normalised away"),
    ("Answer: The answer is 5", "5", -1.0, "the whole line is the answer: 'Theansweris5'"),
    ("Answer: 0.5", "\\frac{1}{2}", -1.0, "strings differ; only the math-verify mode calls them equal"),
    ("Answer:\n204", "204", 1.0, "\\s* after the colon crosses the newline"),
    ("Answer: 204 \n", "204", 1.0, "the group stops at the newline; the trailing space is stripped"),
    ("An\u017fwer: 5", "5", 1.0, "(?i) is Unicode: long s 'ſ' matches 's'"),
    ("Answer: 13\nwait, recheck.\nAnswer: 204", "204", 1.0, "the LAST Answer: counts"),
    ("Answer: 204\nwait, recheck.\nAnswer: 13", "204", -1.0, "the LAST Answer: counts"),
    ("Answer: 204" + "\nmore text" * 40, "204", -1.0, "the Answer: line is not in the last 300 characters"),
    ("The answer is \\boxed{204}", "204", -1.0, "no 'Answer:' and no boxed fallback: pred '[INVALID]'"),
    ("Answer:", "", -1.0, "'Answer:' needs one more character: pred '[INVALID]' vs ''"),
    ("", "[INVALID]", 1.0, "paper quirk kept: no answer gives pred '[INVALID]', equal to this ground truth"),
]


@pytest.mark.parametrize("response,truth,expected,why", HAND_WORKED, ids=[c[3][:50] for c in HAND_WORKED])
def test_hand_worked(response, truth, expected, why, verl_math_dapo):
    result = compute_score("math_dapo", response, truth)
    assert result["score"] == expected, why
    assert result["acc"] is (expected == 1.0)
    assert result == paper_score(verl_math_dapo, response, truth)  # and the paper's scorer says the same


BOXED_FALLBACK = [
    ("The answer is \\boxed{204}", "204", 1.0, "204", "no Answer: -> last \\boxed{} compared with the truth"),
    ("so \\boxed{\\frac{1}{2}}.", "\\frac{1}{2}", 1.0, "\\frac{1}{2}", "braces are balanced, not first-'}'"),
    ("\\boxed{ 204 }", "204", -1.0, " 204 ", "verl compares the boxed text un-normalised"),
    ("\\boxed{$204$}", "204", -1.0, "$204$", "un-normalised, so the $ count"),
    ("\\boxed{204}" + "." * 89, "204", 1.0, "204", "11 + 89 characters: the opener is in the last 100"),
    ("\\boxed{204}" + "." * 90, "204", -1.0, INVALID, "11 + 90 characters: the opener is cut off"),
    ("\\boxed{204", "204", -1.0, INVALID, "unbalanced: no boxed answer"),
    ("Answer: 13 \\boxed{204}", "204", -1.0, "13204", "an Answer: exists (spaces go, \\boxed unwraps): no fallback"),
    ("Answer: [INVALID] \\boxed{204}", "204", -1.0, "[INVALID]204", "normalised pred is not '[INVALID]'"),
    ("Answer: [INVALID]\n\\boxed{204}", "204", 1.0, "204", "normalised pred IS '[INVALID]': verl falls back"),
]


@pytest.mark.parametrize("response,truth,expected,pred,why", BOXED_FALLBACK, ids=[c[4][:50] for c in BOXED_FALLBACK])
def test_boxed_fallback_hand_worked(response, truth, expected, pred, why, verl_math_dapo):
    result = compute_score("math_dapo", response, truth, boxed_fallback=True)
    assert (result["score"], result["pred"]) == (expected, pred), why
    assert result == verl_math_dapo.compute_score(response, truth)


def test_fallback_is_off_by_default():
    assert compute_score("math_dapo", "\\boxed{204}", "204") == {"score": -1.0, "acc": False, "pred": INVALID}


# ------------------------------------------------------------------------------------------------
# Real AIME 2024 ground truths
# ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def aime_truths() -> list[str]:
    pd = pytest.importorskip("pandas")
    frame = pd.read_parquet(AIME_PARQUET)
    assert len(frame) == 960 and set(frame["data_source"]) == {"math_dapo"}
    return [row["ground_truth"] for row in frame["reward_model"]]


COT = (
    "Let me set up the problem. We have $x^2 + y^2 = 25$ and we need the largest value.\n"
    "By Cauchy-Schwarz, $(3x + 4y)^2 \\le (9 + 16)(x^2 + y^2)$, so $3x + 4y \\le 25$.\n"
    "Checking the equality case gives $x = 3$, $y = 4$. Tentatively Answer: 17, but let me re-check.\n" * 5
)

ACCEPTED_FORMS = [  # each a paper-accepted way to write the answer {a}
    "Answer: {a}",
    "answer: {a}",
    "ANSWER :{a}",
    "Answer: ${a}$",
    "Answer: $\\boxed{{{a}}}$",
    "answer: \\boxed{{{a}}}",
    "Answer: ${a}.$",
    "Answer: \\text{{{a}}}",
    "Answer: x = {a}",
    "Answer: {a} \n",
    "Answer:\n\n{a}",
    "Answer: {a} degrees",
    COT + "\nAnswer: {a}",
    COT + "\nThus the final answer is computed.\n\nAnswer: $\\boxed{{{a}}}$",
]
REJECTED_FORMS = [  # the right number, written in ways the paper's scorer does not accept
    "Answer: {a}.",
    "Answer: **{a}**",
    "The answer is {a}",
    "The answer is \\boxed{{{a}}}",
    "Answer: {a}" + " and that is all." * 20,
]


def test_aime_answers_in_accepted_forms_score_1(aime_truths, verl_math_dapo):
    for truth in sorted(set(aime_truths)):
        for form in ACCEPTED_FORMS:
            response = form.format(a=truth)
            result = compute_score("math_dapo", response, truth)
            assert result == {"score": 1.0, "acc": True, "pred": truth}, (form, truth)
            assert result == paper_score(verl_math_dapo, response, truth)
            assert compute_score("math_dapo", response, int(truth)) == result  # an int ground truth works alike


def test_aime_wrong_or_unaccepted_answers_score_minus_1(aime_truths, verl_math_dapo):
    for truth in sorted(set(aime_truths)):
        wrong = [str(int(truth) + 1), str(int(truth) - 1), truth + "0", "0" + truth + "1", "-" + truth]
        responses = [form.format(a=w) for form in ACCEPTED_FORMS for w in wrong]
        responses += [form.format(a=truth) for form in REJECTED_FORMS]
        for response in responses:
            result = compute_score("math_dapo", response, truth)
            assert result["score"] == -1.0 and result["acc"] is False, (response[-60:], truth)
            assert result == paper_score(verl_math_dapo, response, truth)


def test_every_aime_row_scores_its_own_answer(aime_truths):
    results = [compute_score("math_dapo", f"{COT}\nAnswer: {t}", t) for t in aime_truths]
    assert [r["score"] for r in results] == [1.0] * 960


# ------------------------------------------------------------------------------------------------
# Two ways must agree: generated inputs against the paper's scorer and verl's
# ------------------------------------------------------------------------------------------------
TOKENS = [
    "$",
    "\\$",
    "\\text{",
    "\\textbf{",
    "\\overline{",
    "\\boxed{",
    "\\text{m}",
    "\\text{and}",
    "{",
    "}",
    "{,}",
    "\n",
    " ",
    "\t",
    "\r",
    "=",
    ",",
    ".",
    ".$",
    "\\",
    "\\ ",
    "frac",
    "sqrt",
    "a ",
    "an ",
    "mbox",
    "units",
    "^\\circ",
    "\\!",
    "[INVALID]",
    "0",
    "1",
    "2",
    "204",
    "x",
    "\u017f",
    "\u00b2",
    "\x00",
    "Answer:",
    "answer :",
]
token_strings = st.lists(st.sampled_from(TOKENS), max_size=30).map("".join)
texts = st.one_of(token_strings, st.text(max_size=40))
answer_markers = st.sampled_from(
    ["Answer:", "answer:", "ANSWER :", "Answer\n:", "Answer: ", "Answer:\n", "An\u017fwer:"]
)


@settings(max_examples=600, deadline=None)
@given(text=texts)
def test_normalize_matches_paper(text, verl_math_dapo):
    assert normalize_final_answer(text) == verl_math_dapo.normalize_final_answer(text)


@settings(max_examples=400, deadline=None)
@given(
    prefix=st.one_of(texts, st.integers(0, 400).map(lambda n: "reasoning step. " * (n // 16))),
    marker=answer_markers,
    answer=texts,
    suffix=texts,
    truth=texts,
)
def test_default_mode_matches_paper_and_verl(prefix, marker, answer, suffix, truth, verl_math_dapo):
    response = prefix + marker + answer + suffix
    ours = compute_score("math_dapo", response, truth)
    assert ours == paper_score(verl_math_dapo, response, truth)
    if ours["pred"] != INVALID:  # an answer was found, so verl's fallback does not apply: verl agrees too
        assert ours == verl_math_dapo.compute_score(response, truth)


@settings(max_examples=400, deadline=None)
@given(
    prefix=texts,
    marker=st.one_of(st.just(""), answer_markers),
    answer=texts,
    boxed=st.one_of(st.just(""), texts.map(lambda t: "\\boxed{" + t + "}")),
    suffix=texts,
    truth=st.one_of(texts, st.sampled_from(["204", "\\frac{1}{2}", "[INVALID]"])),
)
def test_boxed_fallback_matches_verl(prefix, marker, answer, boxed, suffix, truth, verl_math_dapo):
    response = prefix + marker + answer + boxed + suffix
    assert compute_score("math_dapo", response, truth, boxed_fallback=True) == verl_math_dapo.compute_score(
        response, truth
    )


# ------------------------------------------------------------------------------------------------
# Bad input: a defined result, never an exception or a hang
# ------------------------------------------------------------------------------------------------
NOTHING = {"score": -1.0, "acc": False, "pred": INVALID}
BAD_INPUTS = [
    (None, "204", NOTHING, "a missing response scores -1 with no answer"),
    (204, "204", NOTHING, "numbers are str()-ed: '204' has no Answer:"),
    (["Answer: 204"], "204", NOTHING, "a list is not a response"),
    (b"Answer: 204", "204", {"score": 1.0, "acc": True, "pred": "204"}, "bytes are decoded as UTF-8"),
    (b"Answer: 2\xff04", "204", {"score": -1.0, "acc": False, "pred": "2\ufffd04"}, "invalid UTF-8 -> U+FFFD"),
    ("", "204", NOTHING, "empty response"),
    ("Answer: 204", None, {"score": -1.0, "acc": False, "pred": "204"}, "no ground truth: never correct"),
    ("Answer: 204", ["204"], {"score": -1.0, "acc": False, "pred": "204"}, "a list ground truth: never correct"),
    ("Answer: 204", 204, {"score": 1.0, "acc": True, "pred": "204"}, "an int ground truth is str()-ed"),
    ("Answer: 204", b"204", {"score": 1.0, "acc": True, "pred": "204"}, "a bytes ground truth is decoded"),
    ("Answer: 204", 204.0, {"score": -1.0, "acc": False, "pred": "204"}, "a float becomes '204.0'"),
    ("Answer: 204", True, {"score": -1.0, "acc": False, "pred": "204"}, "bool is not a number here"),
    ("Answer: 2\x0004", "2\x0004", {"score": 1.0, "acc": True, "pred": "2\x0004"}, "NUL is an ordinary char"),
    ("\x00" * 1000, "\x00", NOTHING, "NULs only: no answer"),
]


@pytest.mark.parametrize("response,truth,expected,why", BAD_INPUTS, ids=[c[3][:40] for c in BAD_INPUTS])
def test_bad_input_has_a_defined_result(response, truth, expected, why):
    for boxed_fallback in (False, True):
        assert compute_score("math_dapo", response, truth, boxed_fallback=boxed_fallback) == expected, why


def test_numpy_ground_truth():
    np = pytest.importorskip("numpy")
    assert score("Answer: 204", np.int64(204)) == 1.0
    assert score("Answer: 204", np.str_("204")) == 1.0


MB = 1 << 20
ADVERSARIAL = {  # each took the paper's regexes from seconds (40 kB) to hours (1 MB), or is a long input
    "Answer: repeated": ("Answer:" * (MB // 7), "1"),
    "NUL megabyte": ("\x00" * MB, "\x00" * MB),
    "nested braces": ("{" * MB + "Answer: 1", "{" * MB + "}" * MB),
    "truth without $": ("Answer: 1", "x" * MB),
    "truth with one $": ("Answer: 1", "$" + "x" * MB),
    "truth \\text{ repeated": ("Answer: 1", "\\text{" * (MB // 6)),
    "truth \\text{ + newline": ("Answer: 1", "\\text{\n" * (MB // 7) + "}"),
    "truth \\boxed{ repeated": ("Answer: 1", "\\boxed{" * (MB // 7)),
    "truth \\boxed{a} lines": ("Answer: 1", "\\boxed{a}\n" * (MB // 10)),
    "truth $a$ lines": ("Answer: 1", "$a$b\n" * (MB // 5)),
    "truth frac repeated": ("Answer: 1", "frac" * (MB // 4)),
    "response \\boxed{ repeated": ("\\boxed{" * (MB // 7), "1"),
}


@pytest.mark.parametrize("name", list(ADVERSARIAL))
def test_megabyte_adversarial_input_finishes_quickly(name):
    response, truth = ADVERSARIAL[name]
    start = time.perf_counter()
    for boxed_fallback in (False, True):
        result = compute_score("math_dapo", response, truth, boxed_fallback=boxed_fallback)
        assert result["score"] == -1.0
    assert time.perf_counter() - start < 2 * 2.0  # a hang guard (two calls), not a benchmark


def test_linear_normaliser_agrees_on_long_structured_input(verl_math_dapo):
    # Long enough to exercise every scan, short enough for the paper's quadratic regexes (~0.1 s).
    text = "a $b$ c $d\n\\text{x}y\\text{z\n}\\boxed{q}r}s\\boxed{t\nfrac12fracab\nsqrtx = 3,000\n" * 40
    assert normalize_final_answer(text) == verl_math_dapo.normalize_final_answer(text)


def test_verl_keyword_call_and_extra_kwargs():
    # verl's reward loop: keyword arguments, plus reward_router_address / reward_model_tokenizer when set
    result = compute_score(
        data_source="math_dapo",
        solution_str="Answer: 204",
        ground_truth="204",
        extra_info={"index": 0},
        reward_router_address=None,
        reward_model_tokenizer=None,
    )
    assert result == {"score": 1.0, "acc": True, "pred": "204"}


@pytest.mark.parametrize("knob", [{"strict_box_verify": True}, {"pause_tokens_index": [1, 2, 3, 4]}])
def test_unimplemented_verl_knobs_fail_loudly(knob):
    with pytest.raises(ValueError, match="boxed_fallback=True"):
        compute_score("math_dapo", "Answer: 1", "1", **knob)


def test_module_imports_only_the_standard_library():
    code = (
        "import sys, dapo.reward; bad = {'verl', 'ray', 'math_verify', 'sympy', 'torch'} & set(sys.modules); "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[2])


# ------------------------------------------------------------------------------------------------
# Opt-in math-verify equivalence
# ------------------------------------------------------------------------------------------------
@pytest.fixture
def math_verify_pool():
    pytest.importorskip("math_verify")
    yield
    reward.shutdown_math_verify()


@pytest.mark.slow
def test_math_verify_upgrades_a_mismatch_only(math_verify_pool):
    # "0.5" vs "\frac{1}{2}": -1 as strings (hand-worked above), equal as numbers
    assert compute_score("math_dapo", "Answer: 0.5", "\\frac{1}{2}", use_math_verify=True) == {
        "score": 1.0,
        "acc": True,
        "pred": "0.5",
    }
    assert score("Answer: $\\frac{2}{4}$", "0.5", use_math_verify=True) == 1.0
    assert score("Answer: 0.6", "\\frac{1}{2}", use_math_verify=True) == -1.0
    assert score("no answer line, 0.5", "\\frac{1}{2}", use_math_verify=True) == -1.0  # nothing extracted
    assert score("\\boxed{0.5}", "\\frac{1}{2}", use_math_verify=True, boxed_fallback=True) == 1.0


def test_math_verify_is_not_asked_when_the_strings_match(monkeypatch):
    def must_not_run():
        raise AssertionError("math-verify called although the strict comparison matched")

    monkeypatch.setattr(reward, "_math_verify_pool", must_not_run)
    assert score("Answer: 204", "204", use_math_verify=True) == 1.0


@pytest.mark.parametrize("bad", [0, -1.0, None, "5"])
def test_math_verify_timeout_must_be_positive(bad):
    with pytest.raises(ValueError, match="math_verify_timeout_s"):
        compute_score("math_dapo", "Answer: 1", "1", use_math_verify=True, math_verify_timeout_s=bad)


@pytest.mark.slow
def test_math_verify_works_off_the_main_thread(math_verify_pool):
    # verl runs compute_score in executor threads, where math-verify's own signal timeouts raise
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(score, "Answer: 0.5", "\\frac{1}{2}", use_math_verify=True) for _ in range(4)]
        assert [f.result() for f in futures] == [1.0] * 4
    assert threading.current_thread() is threading.main_thread()


PATHOLOGICAL = "9^{9^{9}}"  # sympy keeps trying to evaluate 9**387420489 against the truth "1"


@pytest.mark.slow
def test_pathological_answer_is_slow_without_a_limit():
    pytest.importorskip("math_verify")
    code = (
        "import sys\nfrom math_verify import parse, verify\n"
        f"gold, pred = parse('$1$', parsing_timeout=None), parse('${PATHOLOGICAL}$', parsing_timeout=None)\n"
        "print('parsed', flush=True)\nverify(gold, pred, timeout_seconds=None)\nprint('done', flush=True)\n"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    try:
        assert process.stdout.readline().strip() == "parsed"  # import + parse done; now time verify alone
        with pytest.raises(subprocess.TimeoutExpired):
            process.wait(timeout=3.0)
    finally:
        process.kill()
        process.wait()


@pytest.mark.slow
def test_time_limit_bounds_a_pathological_answer(math_verify_pool):
    assert score("Answer: 0.5", "1/2", use_math_verify=True) == 1.0  # start a worker (sympy import) first
    start = time.perf_counter()
    result = compute_score("math_dapo", f"Answer: {PATHOLOGICAL}", "1", use_math_verify=True, math_verify_timeout_s=1.0)
    elapsed = time.perf_counter() - start
    assert result == {"score": -1.0, "acc": False, "pred": PATHOLOGICAL}
    assert 1.0 <= elapsed < 1.0 + 1.5  # the limit, plus slack for killing the worker on a busy machine
    # the killed worker was replaced: the next check works
    assert score("Answer: 0.5", "\\frac{1}{2}", use_math_verify=True) == 1.0
