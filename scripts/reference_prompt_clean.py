"""Prompts as WanPipeline cleans them before tokenizing (ftfy.fix_text, HTML unescaped twice,
whitespace runs to one space, stripped), for `crates/models/tests/prompt_clean.rs`.

Usage (needs `pip install ftfy==6.3.1`):
    python scripts/reference_prompt_clean.py fixtures/prompt_clean.json
"""
import html
import json
import re
import sys

import ftfy

PROMPTS = [
    "A cat sitting on a windowsill, golden hour, 4k",
    "  leading and trailing   spaces\tand\ttabs  ",
    "a sign that says “OPEN” in neon",
    "it’s a ‘quoted’ word and „low“ quotes",
    "fish &amp; chips",
    "double &amp;amp; escaped",
    "&lt;b&gt;bold&lt;/b&gt; text",
    "a <b>tag</b> with &amp; inside",
    "numeric &#233; and &#x263A; refs",
    "ﬁsh ﬂakes in an oﬃce",
    "ＦＵＬＬ　ｗｉｄｔｈ text １２３",
    "mojibake: cafÃ© and naÃ¯ve",
    "smart quotes gone wrong: â€œhelloâ€\x9d",
    "line\r\nbreaks\rand\u2028separators",
    "\x1b[31mred\x1b[0m terminal colours",
    "zero\u200bwidth and soft\u00adhyphen",
    "nbsp\u00a0between words",
    "decomposed e\u0301 accent",
    "control\x07bell and \ufeffBOM",
    "ǅ and Ĳ digraphs",
    "emoji 🐱 stays",
    "Chinese 一只猫 stays",
    "copyright &copy; 2026",
]


def clean(text):
    text = ftfy.fix_text(text)
    text = html.unescape(html.unescape(text)).strip()
    return re.sub(r"\s+", " ", text).strip()


json.dump([{"prompt": p, "cleaned": clean(p)} for p in PROMPTS], open(sys.argv[1], "w"), ensure_ascii=False, indent=1)
