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
CONTEXT = (
    "Order #48213 was placed on 12 March by Dana Whitfield (dana.whitfield@example.org) for two ergonomic chairs "
    "(model EC-400, $289.00 each) and one standing desk (model SD-90, $640.00). Shipping went to 17 Harbour Lane, "
    "Portsmouth. The desk arrived damaged on 19 March; a replacement was shipped on 22 March under tracking number "
    "ZX-55190-PL. The customer asked for a 10% discount on the chairs, which support approved on 23 March."
)
PROMPTS = {
    "grounded": f"Repeat the following report word for word, then stop.\n\n{PASSAGE}",
    "summary": f"Summarize the following report in a few sentences, reusing its wording.\n\n{PASSAGE}",
    "code-edit": (
        f"Rename the function to rolling_mean and the variable chunk to segment. Output the full code.\n\n{CODE}"
    ),
    "chat": "What are three good habits for staying healthy? Answer in a short paragraph.",
    "extraction": f"From the support note below, list the order number, customer name, email, items with prices, "
    f"and the replacement tracking number, one per line.\n\n{CONTEXT}",
    "long-context": "Read these reports and then answer: how did the council vote, and what changes for parks?\n\n"
    + "\n\n".join(f"Report {i + 1}: {PASSAGE}" for i in range(5)),
}


def chat(kind: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": PROMPTS[kind]}]


# A mixed batch: one request that copies its prompt (n-gram drafts accepted) beside seven open answers
# decoded plainly (bench/batching.py --mixed-only and the engine's device-time test).
COPY = "Repeat the following text exactly, then stop.\n\n" + "alpha beta gamma delta epsilon zeta eta theta " * 6
LONG_ANSWERS = (
    "Write a long story about a dragon who learns to cook.",
    "Explain in detail how a steam engine works.",
    "Describe a walk through a busy city market, step by step.",
    "Write a letter to a friend about your summer holidays.",
    "Explain how plants make food from sunlight, in detail.",
    "Describe the rules of football to a beginner.",
    "Write a poem about the ocean and the moon.",
)
