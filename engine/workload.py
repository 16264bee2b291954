"""Sample prompts for `specwatch up`, the benchmarks and load generation.

Three kinds, because speculation pays very differently on each: input-grounded
text (repeat / summarise a passage), code edits, and open-ended chat.
"""

from __future__ import annotations

PASSAGE = (
    "The city council met on Tuesday evening to debate next year's budget. The mayor proposed raising funding for "
    "public parks by fifteen percent and cutting road maintenance by five percent. Several council members objected, "
    "arguing that the roads were in poor condition after the winter storms and that potholes had damaged hundreds of "
    "cars. After three hours of debate, the council voted seven to four for a compromise: parks funding rises by ten "
    "percent, road maintenance stays unchanged, and a new committee will review the city's infrastructure spending by "
    "the end of March."
)
CODE = '''def moving_average(values, window):
    """Return the moving average of values over the given window."""
    result = []
    for i in range(len(values)):
        chunk = values[i:i + window]
        result.append(sum(chunk) / window)
    return result
'''
PROMPTS = {
    "grounded": f"Repeat the following report word for word, then stop.\n\n{PASSAGE}",
    "summary": f"Summarize the following report in a few sentences, reusing its wording.\n\n{PASSAGE}",
    "code-edit": f"Rename the function to rolling_mean and the variable chunk to segment. Output the full code.\n\n{CODE}",
    "chat": "What are three good habits for staying healthy? Answer in a short paragraph.",
}


def chat(kind: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": PROMPTS[kind]}]
