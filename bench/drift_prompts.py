"""Varied chat prompts for recording vLLM's per-request acceptance (bench/drift_record_vllm.py).

Six kinds, because prompt-lookup speculation pays very differently on each: code (write or edit),
open chat, summarise, copy verbatim, lists, and templated support replies; plus the workload's own
prompts (specwatch/workload.py). `plan(n)` interleaves the kinds and varies the subject within each.
"""

from __future__ import annotations

from bench.engine import templated_requests
from specwatch.workload import CODE, CONTEXT, PASSAGE, PROMPTS

SUBJECTS = (
    "sourdough bread",
    "solar panels",
    "honey bees",
    "the Roman aqueducts",
    "electric bicycles",
    "coral reefs",
    "chess openings",
    "container shipping",
    "volcanoes",
    "public libraries",
    "vaccines",
    "jazz music",
)
FUNCTIONS = (
    "reverses a string",
    "counts the vowels in a sentence",
    "returns the n-th Fibonacci number",
    "checks whether a number is prime",
    "merges two sorted lists",
    "flattens a nested list",
    "parses a date in YYYY-MM-DD form",
    "removes duplicate items while keeping their order",
    "computes the median of a list",
    "converts Celsius to Fahrenheit",
)
LANGUAGES = ("Python", "JavaScript", "Go", "Rust")
PASSAGES = (PASSAGE, CONTEXT, CODE)


def passage(i: int) -> str:
    """One of the workload's passages, or a to-do list of the functions above in a rotated order."""
    if i % 4 == 3:
        tasks = FUNCTIONS[i % len(FUNCTIONS) :] + FUNCTIONS[: i % len(FUNCTIONS)]
        return "\n".join(f"- write a function that {task}" for task in tasks)
    return PASSAGES[i % len(PASSAGES)]


def code(i: int) -> str:
    if i % 2:
        return f"Rewrite this code with type hints and a docstring, keeping everything else.\n\n{CODE}"
    return f"Write a {LANGUAGES[i % len(LANGUAGES)]} function that {FUNCTIONS[i % len(FUNCTIONS)]}. Code only."


def chat(i: int) -> str:
    questions = ("Why is {} interesting?", "Explain {} to a ten-year-old.", "What are the pros and cons of {}?")
    return questions[i % len(questions)].format(SUBJECTS[i % len(SUBJECTS)])


def summary(i: int) -> str:
    return f"Summarize the following in two sentences, reusing its wording.\n\n{passage(i)}"


def copy(i: int) -> str:
    return f"Repeat the following text word for word, then stop.\n\n{passage(i)}"


def listing(i: int) -> str:
    forms = ("List ten facts about {}, one per line.", "Give a numbered list of 8 steps to learn about {}.")
    return forms[i % len(forms)].format(SUBJECTS[(i * 5) % len(SUBJECTS)])


def support(i: int) -> str:
    return templated_requests(i + 1)[i][0]["content"]


def workload(i: int) -> str:
    return list(PROMPTS.values())[i % len(PROMPTS)]


KINDS = {"code": code, "chat": chat, "summary": summary, "copy": copy, "list": listing, "support": support}


def plan(count: int) -> list[tuple[str, str]]:
    """`count` (kind, prompt) pairs: the kinds in turn, one workload prompt after each round."""
    kinds = [*KINDS, "workload"]
    makers = {**KINDS, "workload": workload}
    return [(kinds[i % len(kinds)], makers[kinds[i % len(kinds)]](i // len(kinds))) for i in range(count)]
