"""Write HotpotQA's closed set in the shape of "a user's own data", for the bring-your-own-data example.

This stands in for the export a user already has; rlkit itself reads the result with no conversion:
- `train.jsonl` / `eval.jsonl` (first 80 / last 20 questions), one question per line, in the user's own
  column names: `qid`, `q`, `gold`, `alt_answers` (HotpotQA has none: an empty list), `hop_type`
  (bridge / comparison) and `evidence_pages` (the page ids of the supporting paragraphs);
- `corpus.json`: one JSON array of `{"page_id", "page", "body_text"}`, a page id per paragraph.

Usage: python3 examples/hotpotqa_byod.py [HOTPOTQA_DIR] [OUT_DIR]   (or: make hotpotqa-data)
Defaults: ../shared/data/hotpotqa_closed and data/hotpotqa_byod. Standard library only.
HotpotQA is CC BY-SA 4.0 (the files come from HippoRAG's repository, MIT); the output is not committed.
"""

import json
import sys
from pathlib import Path

source = Path(sys.argv[1] if len(sys.argv) > 1 else "../shared/data/hotpotqa_closed")
out = Path(sys.argv[2] if len(sys.argv) > 2 else "data/hotpotqa_byod")
if not (source / "hotpotqa_train.json").is_file():
    sys.exit(f"{source}: no hotpotqa_train.json; give the HotpotQA closed-set directory")
questions = json.loads((source / "hotpotqa_train.json").read_text(encoding="utf-8"))
corpus = json.loads((source / "hotpotqa_train_corpus.json").read_text(encoding="utf-8"))

page_ids = {title: f"page-{i:04d}" for i, title in enumerate(corpus)}
out.mkdir(parents=True, exist_ok=True)
pages = [{"page_id": page_ids[title], "page": title, "body_text": "".join(sentences)}
         for title, sentences in corpus.items()]
(out / "corpus.json").write_text(json.dumps(pages, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
rows = [{"qid": q["_id"], "q": q["question"], "gold": q["answer"], "alt_answers": [], "hop_type": q["type"],
         "evidence_pages": list(dict.fromkeys(page_ids[title] for title, _ in q["supporting_facts"]))}
        for q in questions]
for name, part in (("train.jsonl", rows[:80]), ("eval.jsonl", rows[80:])):
    (out / name).write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in part), encoding="utf-8")
print(f"{out}: train.jsonl ({len(rows[:80])} questions), eval.jsonl ({len(rows[80:])}), "
      f"corpus.json ({len(pages)} pages)")
