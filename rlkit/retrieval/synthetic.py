"""A seeded news corpus and MultiHop-RAG-style questions over it, for tests and `--smoke` runs.

`articles(n, seed)` writes records in the format of MultiHop-RAG's `corpus.json` about fictional
companies (no fact can be mistaken for a real one). Each company is covered by several outlets on
different dates between 2023-09-26 and 2023-12-26, and every body states concrete facts: revenue
growth, hiring plans, prices, what the chief executive said.

`queries(articles, n, seed)` writes records in the format of `MultiHopRAG.json`, cycling through the
four upstream question types. `wording="other"` asks the same kinds of question in shapes and phrases the
classic family never uses (a check that what a model learned is not tied to the training wording).
Like upstream, questions name outlets and dates, every `fact` in an `evidence_list` is a sentence copied
verbatim from that article's body, and a null query asks about a company that is not in the corpus
(answer exactly "Insufficient information.").
"""

from __future__ import annotations

import itertools
import random
import re
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from rlkit.errors import BadValue
from rlkit.retrieval.dates import readable_date

VERSION = "synthetic-news-v1"  # part of the index cache key: bump when the generated text changes
NULL_ANSWER = "Insufficient information."
QUESTION_TYPES = ("inference_query", "comparison_query", "temporal_query", "null_query")

OUTLETS = {"TechCrunch": "techcrunch.com", "The Verge": "theverge.com", "BBC News": "bbc.co.uk",
           "Engadget": "engadget.com", "Fortune": "fortune.com", "The Guardian": "theguardian.com",
           "Wired": "wired.com", "Reuters": "reuters.com"}
_CATEGORIES = {"Systems": "technology", "Labs": "science", "Robotics": "technology", "Energy": "business",
               "Health": "health", "Networks": "technology", "Games": "entertainment", "Foods": "business"}
_PREFIXES = ["Nor", "Quan", "Vel", "Astra", "Bright", "Cobal", "Lumen", "Hexa", "Zephy", "Orbi", "Kestr", "Mira"]
_SUFFIXES = ["via", "tel", "ora", "lyn", "dex", "wave", "nova", "ion"]
_NULL_PREFIXES = ["Grimwald", "Pendleton", "Ostrova", "Tavish"]  # never used by `articles`
_PRODUCTS = ["Pulse", "Atlas", "Nimbus", "Vector", "Echo", "Spark", "Halo", "Drift"]
_FIRST = ["Dana", "Ravi", "Elena", "Marcus", "Yuki", "Amara", "Tomas", "Priya", "Jonah", "Leila", "Felix", "Ines"]
_LAST = ["Whitfield", "Okafor", "Lindqvist", "Moreau", "Tanaka", "Brennan", "Castillo", "Haddad", "Novak", "Reyes"]
_CITIES = ["Lisbon", "Austin", "Nairobi", "Seoul", "Toronto", "Warsaw", "Bangalore", "Dublin", "Bogota", "Osaka"]
_ZONES = [timezone.utc, timezone(timedelta(hours=-5)), timezone(timedelta(hours=1))]
# Starting at 06:00 UTC keeps every local date (offsets -5 h to +1 h) within 2023-09-26 .. 2023-12-26.
_START = datetime(2023, 9, 26, 6, tzinfo=timezone.utc)
_DAYS = 91

# fact key -> (sentence in the body, clause after "Which company ..." in an inference question)
_FACTS = {
    "revenue": ("{company} reported quarterly revenue of ${revenue} million, up {growth}% from a year earlier.",
                "reported quarterly revenue growth of {growth}%"),
    "hiring": ("{company} plans to hire {hires} engineers in {city} by the end of next year.",
               "plans to hire {hires} engineers in {city}"),
    "price": ("The {product} will sell for ${price} when it reaches stores in {countries} countries.",
              "will sell the {product} for ${price}"),
    "ceo": ("{ceo}, the chief executive of {company}, said the {product} had {users} thousand users in its first week.",
            "has a chief executive who said the {product} had {users} thousand users in its first week"),
}
# The second wording family: the same facts, other clauses ("Name the firm that ...").
_OTHER_CLAUSES = {"revenue": "saw its quarterly revenue rise {growth}%",
                  "hiring": "intends to add {hires} engineers in {city}",
                  "price": "priced the {product} at ${price}",
                  "ceo": "is run by someone who said {users} thousand people used the {product} in its first week"}
_FILLER = ["Analysts said the announcement reflects a wider shift in the {category} industry.",
           "The company did not respond to a request for further comment.",
           "Competitors are expected to respond with products of their own early next year."]
_TITLES = ["{company} unveils the {product} as revenue climbs {growth}%",
           "{company} to hire {hires} engineers in {city}",
           "{product} reaches {users} thousand users, {company} says"]


def articles(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """`n` news articles in MultiHop-RAG's corpus format; about three per company. Same seed, same articles."""
    rng = random.Random(seed)
    names = [f"{p}{s} {k}" for p, s, k in itertools.product(_PREFIXES, _SUFFIXES, _CATEGORIES)]
    n_companies = max(2, -(-n // 3))
    if n_companies > len(names):
        raise BadValue(f"at most {3 * len(names)} synthetic articles, got {n}")
    companies = [{"company": name, "category": _CATEGORIES[name.split()[-1]], "city": rng.choice(_CITIES),
                  "ceo": f"{rng.choice(_FIRST)} {rng.choice(_LAST)}",
                  "product": f"{rng.choice(_PRODUCTS)} {rng.randint(2, 9)}",
                  "outlets": rng.sample(list(OUTLETS), len(OUTLETS))}
                 for name in rng.sample(names, n_companies)]
    out = []
    for i in range(n):
        company = companies[i % n_companies]
        facts = {**company, "revenue": rng.randint(20, 900), "growth": rng.randint(2, 60),
                 "hires": rng.randrange(50, 2000, 10), "price": rng.randrange(99, 1999, 100),
                 "countries": rng.randint(3, 40), "users": rng.randint(10, 900)}
        source = company["outlets"][i // n_companies % len(OUTLETS)]
        date = (_START + timedelta(minutes=rng.randrange(_DAYS * 24 * 60))).astimezone(rng.choice(_ZONES))
        sentences = [template.format(**facts) for template, _ in _FACTS.values()]
        sentences += [s.format(**facts) for s in rng.sample(_FILLER, 2)]
        rng.shuffle(sentences)
        title = rng.choice(_TITLES).format(**facts)
        out.append({
            "title": title, "author": f"{rng.choice(_FIRST)} {rng.choice(_LAST)}", "source": source,
            "published_at": date.isoformat(), "category": company["category"],
            "url": f"https://www.{OUTLETS[source]}/{date:%Y/%m/%d}/{re.sub(r'[^a-z0-9]+', '-', title.lower())}/",
            "body": " ".join(sentences),
        })
    return out


def queries(corpus: list[dict[str, Any]], n: int, seed: int = 0, wording: str = "classic") -> list[dict[str, Any]]:
    """`n` questions in MultiHopRAG.json's format over `articles(...)` output, cycling through the four types;
    ``wording`` is ``classic`` or ``other`` (same answers and evidence for the same seed, other sentences)."""
    if wording not in ("classic", "other"):
        raise BadValue(f"wording must be 'classic' or 'other', not {wording!r}")
    other = wording == "other"
    rng = random.Random(seed)
    by_company: dict[str, list[_Article]] = {}
    for article in corpus:
        facts = _parse(article["body"])
        by_company.setdefault(facts["company"], []).append(_Article(article, facts, other))
    multi = [group for group in by_company.values() if len(group) >= 2]
    if not multi or len(by_company) < 2:
        raise BadValue("synthetic queries need at least 3 articles")
    out = []
    for i in range(n):
        kind = QUESTION_TYPES[i % len(QUESTION_TYPES)]
        if kind == "inference_query":
            a, b = rng.sample(rng.choice(multi), 2)
            key_a, key_b = rng.sample(list(_FACTS), 2)
            query = (f"Name the firm that {a.clause(key_a)} ({a.cite()}) and that {b.clause(key_b)} ({b.cite()})."
                     if other else f"Which company {a.clause(key_a)}, according to {a.cite()}, and "
                                   f"{b.clause(key_b)}, according to {b.cite()}?")
            answer, evidence = a.facts["company"], [a.evidence(key_a), b.evidence(key_b)]
        elif kind == "comparison_query":
            a, b = _two_companies(by_company, rng)
            query = (f"Was the revenue growth of {a.facts['company']} ({a.cite()}) greater than that of "
                     f"{b.facts['company']} ({b.cite()})?" if other else
                     f"Did {a.cite()} report higher revenue growth for {a.facts['company']} than {b.cite()} "
                     f"reported for {b.facts['company']}?")
            higher = int(a.facts["growth"]) > int(b.facts["growth"])
            answer, evidence = _yes_no(higher), [a.evidence("revenue"), b.evidence("revenue")]
        elif kind == "temporal_query":
            a, b = _two_companies(by_company, rng)
            query = (f"Did {a.source} say that {a.facts['company']} {a.clause('price')} earlier than {b.source} "
                     f"said that {b.facts['company']} {b.clause('hiring')}?" if other else
                     f"Was {a.source}'s report that {a.facts['company']} {a.clause('price')} published before "
                     f"{b.source}'s report that {b.facts['company']} {b.clause('hiring')}?")
            answer, evidence = _yes_no(a.date < b.date), [a.evidence("price"), b.evidence("hiring")]
        else:
            a = rng.choice(rng.choice(list(by_company.values())))
            company = f"{rng.choice(_NULL_PREFIXES)} {rng.choice(list(_CATEGORIES))}"
            query = (f"How much does the {a.facts['product']} of {company} cost ({a.cite()})?" if other else
                     f"What price did {a.cite()} give for the {a.facts['product']} made by {company}?")
            answer, evidence = NULL_ANSWER, []
        out.append({"query": query, "answer": answer, "question_type": kind, "evidence_list": evidence})
    return out


@dataclass
class _Article:
    """An article with the values its fact sentences were written from."""

    record: dict[str, Any]
    facts: dict[str, str]
    other: bool = False  # the second wording family

    @property
    def source(self) -> str:
        return self.record["source"]

    @property
    def date(self) -> datetime:
        return datetime.fromisoformat(self.record["published_at"])

    def clause(self, key: str) -> str:
        return (_OTHER_CLAUSES[key] if self.other else _FACTS[key][1]).format(**self.facts)

    def cite(self) -> str:
        date = readable_date(self.record["published_at"])
        return f"as {self.source} reported it on {date}" if self.other else f"{self.source} on {date}"

    def evidence(self, key: str) -> dict[str, Any]:
        fields = ("title", "author", "url", "source", "category", "published_at")
        return {k: self.record[k] for k in fields} | {"fact": _FACTS[key][0].format(**self.facts)}


def _parse(body: str) -> dict[str, str]:
    """The values `articles` wrote into a body's fact sentences: formatting `_FACTS`, inverted."""
    values: dict[str, str] = {}
    for sentence, _ in _FACTS.values():
        pattern = re.sub(r"\\\{(\w+)\\\}", r"(?P<\1>[^.,]+?)", re.escape(sentence))
        match = re.search(r"(?:^|(?<=\. ))" + pattern, body)
        if match is None:
            raise ValueError(f"not an article written by `articles()`: {body[:60]!r}...")
        values.update(match.groupdict())
    return values


def _two_companies(by_company: dict[str, list[_Article]], rng: random.Random) -> tuple[_Article, _Article]:
    first, second = rng.sample(list(by_company), 2)
    return rng.choice(by_company[first]), rng.choice(by_company[second])


def _yes_no(value: bool) -> str:
    return "Yes" if value else "No"
