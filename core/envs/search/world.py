"""A seeded fictional world for the search environment: entities, facts, documents. Torch-free.

Answers must come from retrieved documents, never from a model's prior knowledge, so every name is
invented (syllable strings checked to be unique across the world). The world has four kinds of
entity, each with one short document titled by its name:

    country  capital (city), founding year, river, currency
    city     country, founding year, mayor (person)
    company  headquarters (city), CEO (person), founder (person), founding year
    person   birth year, birthplace (city)

Each fact is one sentence of a fixed template (``Relation.sentence``), e.g. "The capital of Osk is
Varno." — formulaic on purpose: a small model can learn to read the answer off the evidence, and
the scripted expert reads bridge entities back out of retrieved text with the same template.

Every entity has a *home country* and all facts stay inside it (a city's mayor and a company's CEO
are born in that country), so splitting questions by home country gives train and held-out splits
whose questions share no entity at all (only the world's years can coincide).
Everything is a pure function of the world seed (SHA-256-seeded ``random.Random``).
"""
from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass, field
from functools import lru_cache

WORLD_SEED = 20240611
"""The default world: every run shares it unless an env is built with another world_seed."""

HELDOUT_FRACTION = 0.2


@dataclass(frozen=True)
class Relation:
    name: str
    subject: str
    """Entity kind of the subject: country | city | company | person."""
    obj: str
    """Entity kind of the object, or 'year' / 'value' for literals."""
    question: str
    """Question with {s} for the subject (a name, or another relation's descriptor)."""
    sentence: str
    """The document sentence stating the fact, with {s} and {o}."""
    query: str
    """The scripted expert's search query for this fact, with {s}."""
    need: str
    """What is being looked for, as the expert's thought says it, with {s}."""
    descriptor: str = ""
    """How the object is named in a two-hop question, with {s} (entity objects only)."""

    def pattern(self, subject: str) -> re.Pattern:
        """Regex whose group 1 is the object of this fact about ``subject`` in document text."""
        before, after = self.sentence.split("{o}")
        return re.compile(r"(?<!\w)" + re.escape(before.format(s=subject)) + r"([^.\n]+?)"
                          + re.escape(after.format(s=subject)))


RELATIONS: dict[str, Relation] = {r.name: r for r in (
    Relation("capital", "country", "city", "What is the capital of {s}?",
             "The capital of {s} is {o}.", "capital of {s}", "the capital of {s}",
             "the capital of {s}"),
    Relation("country_founded", "country", "year", "In what year was {s} founded?",
             "{s} was founded in {o}.", "{s} founded", "the year {s} was founded"),
    Relation("river", "country", "value", "Which river flows through {s}?",
             "The {o} flows through {s}.", "river of {s}", "the river of {s}"),
    Relation("currency", "country", "value", "What is the currency of {s}?",
             "The currency of {s} is the {o}.", "currency of {s}", "the currency of {s}"),
    Relation("city_country", "city", "country", "In which country is {s} located?",
             "{s} is a city in {o}.", "{s} city country", "the country of {s}",
             "the country where {s} is located"),
    Relation("city_founded", "city", "year", "In what year was {s} founded?",
             "{s} was founded in {o}.", "{s} founded", "the year {s} was founded"),
    Relation("mayor", "city", "person", "Who is the mayor of {s}?",
             "The mayor of {s} is {o}.", "mayor of {s}", "the mayor of {s}", "the mayor of {s}"),
    Relation("hq", "company", "city", "In which city is {s} headquartered?",
             "{s} is headquartered in {o}.", "{s} headquarters", "where {s} is headquartered",
             "the city where {s} is headquartered"),
    Relation("ceo", "company", "person", "Who is the CEO of {s}?",
             "The CEO of {s} is {o}.", "CEO of {s}", "the CEO of {s}", "the CEO of {s}"),
    Relation("founder", "company", "person", "Who founded {s}?",
             "{s} was founded by {o}.", "founder of {s}", "the founder of {s}",
             "the founder of {s}"),
    Relation("company_founded", "company", "year", "In what year was {s} founded?",
             "{s} was founded in {o}.", "{s} founded", "the year {s} was founded"),
    Relation("birth_year", "person", "year", "In what year was {s} born?",
             "{s} was born in {o}.", "{s} born", "the year {s} was born"),
    Relation("birthplace", "person", "city", "In which city was {s} born?",
             "The birthplace of {s} is {o}.", "birthplace of {s}", "the birthplace of {s}",
             "the city where {s} was born"),
)}

# Fact order inside each kind's document.
DOC_FACTS = {kind: [r.name for r in RELATIONS.values() if r.subject == kind]
             for kind in ("country", "city", "company", "person")}

_ONSETS = ["b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr",
           "gr", "kr", "st", "th", "tr", "sk", "h", "j"]
_VOWELS = ["a", "e", "i", "o", "u", "a", "e", "o", "ae", "ia", "ou"]
_CODAS = ["", "", "", "n", "r", "l", "s", "k", "th", "m", "nd", "rt"]
# Words the documents and questions use: an entity named like one would confuse retrieval.
_RESERVED = {"capital", "city", "country", "founded", "mayor", "river", "currency", "born",
             "birthplace", "headquarters", "headquartered", "company", "founder", "year", "ceo",
             "located", "flows", "through", "which", "what", "where", "there", "these", "those",
             "other", "then", "than", "into", "more", "most", "some", "such", "only", "same",
             "once", "here", "this", "that", "they", "them", "their", "with", "from", "were"}
_COMPANY_SUFFIXES = ["Industries", "Systems", "Holdings", "Works", "Labs", "Group", "Trading",
                     "Foods", "Motors", "Textiles", "Shipping", "Energy"]
_INDUSTRIES = ["shipping", "mining", "software", "textile", "farming", "banking", "glassmaking",
               "brewing", "railway", "publishing", "fishing", "timber"]
_OCCUPATIONS = ["engineer", "painter", "lawyer", "physician", "merchant", "teacher", "architect",
                "poet", "chemist", "sailor", "judge", "historian"]
_REGIONS = ["Northern Reach", "Southern Reach", "Eastern Marches", "Western Marches",
            "Inner Basin", "Outer Isles"]


@dataclass(frozen=True)
class Doc:
    doc_id: str
    title: str
    text: str


@dataclass
class World:
    seed: int
    kind: dict[str, str] = field(default_factory=dict)
    """entity name -> country | city | company | person"""
    home: dict[str, str] = field(default_factory=dict)
    """entity name -> its home country (the split key)"""
    facts: dict[tuple[str, str], str] = field(default_factory=dict)
    """(relation, subject) -> object"""
    docs: list[Doc] = field(default_factory=list)
    doc_of: dict[str, str] = field(default_factory=dict)
    """entity name -> doc_id of its document"""

    def entities(self, kind: str) -> list[str]:
        return [name for name, k in self.kind.items() if k == kind]

    def golds(self, relation: str, obj: str) -> tuple[str, ...]:
        """Accepted answers for a fact's object (aliases: 'Lenna' for 'Lenna River')."""
        if relation == "river":
            return (obj, obj.rsplit(" ", 1)[0])
        return (obj,)

    def split_of(self, entity: str) -> str:
        """train | heldout, by a digest of the entity's home country."""
        digest = hashlib.sha256(f"{self.seed}/{self.home[entity]}".encode()).digest()
        return "heldout" if digest[0] < 256 * HELDOUT_FRACTION else "train"


class _Names:
    """Unique invented words; none equal to another entity's word or a reserved word."""

    def __init__(self, rng: random.Random):
        self.rng, self.used = rng, set(_RESERVED)

    def word(self, min_syllables: int = 2, max_syllables: int = 3) -> str:
        while True:
            n = self.rng.randint(min_syllables, max_syllables)
            parts = [self.rng.choice(_ONSETS) + self.rng.choice(_VOWELS) for _ in range(n)]
            w = ("".join(parts) + self.rng.choice(_CODAS)).capitalize()
            if 4 <= len(w) <= 9 and w.lower() not in self.used:
                self.used.add(w.lower())
                return w


def _a(noun: str) -> str:
    return ("an " if noun[0] in "aeiou" else "a ") + noun


def _document(world: World, name: str, lead: list[str]) -> str:
    facts = [RELATIONS[r].sentence.format(s=name, o=world.facts[(r, name)])
             for r in DOC_FACTS[world.kind[name]] if (r, name) in world.facts]
    return " ".join(lead + facts)


def generate_world(seed: int = WORLD_SEED, n_countries: int = 300, cities_per_country: int = 3,
                   companies_per_country: int = 2, extra_people_per_country: int = 2) -> World:
    """Build the world deterministically from ``seed`` (sizes give ~4k documents by default)."""
    rng = random.Random(hashlib.sha256(f"world/{seed}".encode()).digest())
    names, w = _Names(rng), World(seed=seed)
    first_names = [names.word(1, 2) for _ in range(160)]
    surnames = [names.word(2, 3) for _ in range(400)]
    used_people: set[str] = set()

    def add(name: str, kind: str, home: str) -> str:
        w.kind[name], w.home[name] = kind, home
        return name

    def person(home: str, cities: list[str]) -> str:
        while True:
            name = f"{rng.choice(first_names)} {rng.choice(surnames)}"
            if name not in used_people:
                used_people.add(name)
                break
        add(name, "person", home)
        w.facts[("birth_year", name)] = str(rng.randint(1890, 2000))
        w.facts[("birthplace", name)] = rng.choice(cities)
        return name

    for _ in range(n_countries):
        country = add(names.word(), "country", "")
        w.home[country] = country
        cities = [add(names.word(), "city", country) for _ in range(cities_per_country)]
        w.facts[("capital", country)] = cities[0]
        w.facts[("country_founded", country)] = str(rng.randint(800, 1950))
        w.facts[("river", country)] = f"{names.word()} River"
        w.facts[("currency", country)] = names.word(1, 2).lower()
        for city in cities:
            w.facts[("city_country", city)] = country
            w.facts[("city_founded", city)] = str(rng.randint(600, 1900))
            mayor = person(country, cities)
            w.facts[("mayor", city)] = mayor
        for _ in range(companies_per_country):
            company = add(f"{names.word()} {rng.choice(_COMPANY_SUFFIXES)}", "company", country)
            w.facts[("hq", company)] = rng.choice(cities)
            ceo, founder = person(country, cities), person(country, cities)
            w.facts[("ceo", company)] = ceo
            w.facts[("founder", company)] = founder
            w.facts[("company_founded", company)] = str(rng.randint(1800, 2015))
        for _ in range(extra_people_per_country):
            person(country, cities)

    for name, kind in w.kind.items():
        # Facts are stated once, in the subject's own document: a capital's document does not say
        # it is the capital, a mayor's does not say whose. So the first search of a two-hop
        # question finds the bridge entity, and only a second search finds the answer.
        lead = {"country": f"{name} is a country in the {rng.choice(_REGIONS)}.",
                "city": "",
                "company": f"{name} is {_a(rng.choice(_INDUSTRIES))} company.",
                "person": f"{name} is {_a(rng.choice(_OCCUPATIONS))}."}[kind]
        doc = Doc(doc_id=f"{kind}/{name.lower().replace(' ', '-')}", title=name,
                  text=_document(w, name, [lead] if lead else []))
        w.docs.append(doc)
        w.doc_of[name] = doc.doc_id
    return w


@lru_cache(maxsize=4)
def cached_world(seed: int = WORLD_SEED) -> World:
    """One shared World per seed and process (train and eval envs reuse it)."""
    return generate_world(seed)
