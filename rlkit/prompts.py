"""System prompts used on more than one layer.

The GSM8K task sends ``MATH_TUTOR`` (``rlkit.data.gsm8k``), and the tiny test model's tokenizer is
trained on it (``rlkit.tiny``) so that it encodes into few tokens. Both read it from here, below both.
"""

MATH_TUTOR = (
    "You are a careful math tutor. Reason step by step, then give the final answer "
    "on the last line in the form `#### <number>`."
)
