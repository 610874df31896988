"""The discovery engine: terms, ranking, sets, requirements, budgets, tools, confidence."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import Any

import pytest

from reactor_fabric import _token_counter
from reactor_fabric._token_counter import forget_child, load_in_child
from reactor_fabric.discovery import (
    ServiceText,
    build_index,
    find_tools,
    rank_servers,
    terms,
    tokens,
)
from reactor_fabric.discovery.calibration import Calibration
from reactor_fabric.discovery.catalog_file import (
    CatalogFormatError,
    catalog_json,
    services_from_json,
)
from reactor_fabric.discovery.ranking import _query as query_of
from reactor_fabric.discovery.ranking import with_choice
from reactor_fabric.discovery.text import compounds, marks, query_terms, stem
from reactor_fabric.discovery.tokens import (
    Tokenizer,
    count_definition,
    definition_text,
    estimate,
)
from reactor_fabric.protocol.catalog import Catalog, service_catalog
from reactor_fabric.protocol.fabric_discovery import index_catalog


def tool(name: str, description: str = "", *arguments: str) -> dict[str, Any]:
    properties = {argument: {"type": "string"} for argument in arguments}
    return {
        "name": name,
        "description": description,
        "inputSchema": {"type": "object", "properties": properties},
    }


def size(definition: dict[str, Any]) -> int:
    return estimate(definition_text(definition))


GIT = ServiceText(
    "git",
    description="Read and change a Git repository",
    tools=(
        tool("git_log", "Show the commit history", "repo_path", "max_count"),
        tool("git_create_branch", "Create a new branch", "repo_path", "branch_name"),
        tool("git_diff", "Show changes between commits", "repo_path", "target"),
    ),
)
TIME = ServiceText(
    "time",
    description="Time and time zone conversion",
    tools=(
        tool("get_current_time", "Current time in a time zone", "timezone"),
        tool("convert_time", "Convert a time between time zones", "source_timezone", "time"),
    ),
)
SENTRY = ServiceText(
    "sentry",
    description="",  # says nothing about itself: its tools carry it
    tools=(
        tool("list_issues", "List error events and crash reports of a project", "project"),
        tool("get_stack_trace", "The stack trace of an exception event", "event_id"),
    ),
)
TRACKER = ServiceText(
    "tracker",
    description="Issue tracker for teams",
    requires=("git",),
    tools=(tool("create_ticket", "Create a ticket in the issue tracker", "title", "body"),),
)
SUITE = [GIT, TIME, SENTRY, TRACKER]


def index_of(services: list[ServiceText] = SUITE, **weights: Any) -> Any:
    return build_index(services, count_tokens=size)


# --- terms --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("git_create_branch", ["git", "creat", "branch"]),
        ("createPullRequest", ["createpullrequest", "creat", "pull", "request"]),
        ("getHTTPResponse", ["gethttprespons", "get", "http", "respons"]),
        ("brave-search", ["brave", "search"]),
        ("Can you please list the files?", ["list", "file"]),
        ("open PRs in my repo", ["open", "pull", "request", "repositori"]),
        ("k8s pods", ["kubernet", "pod"]),
        ("commits committed committing", ["commit", "commit", "commit"]),
    ],
)
def test_terms_split_identifiers_drop_stop_words_expand_abbreviations_and_stem(
    text: str, expected: list[str]
) -> None:
    assert terms(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("post it in #deploys", ["channel"]),
        ("what does https://example.com/a/b say", ["url", "web", "page"]),
        ("open localhost:3000/signup", ["url", "web", "page"]),
        ("compare config/prod.yaml and ~/x", ["file"]),
        ("PR #77 on GitHub", []),  # a number is not a channel
        ("plain words only", []),
    ],
)
def test_what_a_task_mentions_by_its_form_adds_the_catalogs_word(
    text: str, expected: list[str]
) -> None:
    assert marks(text) == expected


def test_adjacent_words_are_offered_written_together_without_stop_words_between() -> None:
    assert "checkout" in compounds("check it out")
    assert "signup" in compounds("users who sign up")
    assert query_terms("post in #deploys") == ["post", "deploy", "channel"]


def test_terms_of_a_huge_identifier_are_dropped_not_indexed() -> None:
    assert terms("a" * 500 + " branch") == ["branch"]


# --- ranking ------------------------------------------------------------------------------------


def test_a_task_naming_a_service_ranks_it_first() -> None:
    ranking = rank_servers(index_of(), "ask sentry what broke")
    assert ranking.ranked[0].name == "sentry"
    assert ranking.recommended[0] == "sentry"


def test_a_word_of_the_description_extending_the_name_counts_as_naming_it() -> None:
    postgres = ServiceText(
        "postgres",
        description="MCP server for PostgreSQL databases",
        tools=(tool("query", "Run a read-only SQL query"),),
    )
    other = ServiceText(
        "warehouse",
        description="Query tables, run SQL, list databases and schemas",
        tools=(tool("run_query", "Run a SQL query on the warehouse tables", "sql"),),
    )
    ranking = rank_servers(index_of([other, postgres]), "run this query on our postgresql db")
    assert ranking.recommended[0] == "postgres"


def test_a_compound_the_catalog_knows_finds_its_tool() -> None:
    ranking = rank_servers(index_of(), "check out a branch", top=5)
    assert ranking.recommended == ("git",)
    git = ServiceText("git", tools=(tool("git_checkout", "Switch branches"),))
    hits = find_tools(index_of([git, TIME]), "check it out")
    assert hits[0].tool.name == "git_checkout"


def test_a_service_with_no_description_is_found_by_its_tools() -> None:
    ranking = rank_servers(index_of(), "show me the stack trace of that crash")
    assert ranking.recommended == ("sentry",)
    assert ranking.ranked[0].best_tool == "get_stack_trace"


def test_a_task_spanning_two_domains_recommends_both_services() -> None:
    ranking = rank_servers(index_of(), "what time is it in Tokyo, and show the git commit history")
    assert set(ranking.recommended) == {"time", "git"}


def test_a_single_domain_task_recommends_one_service() -> None:
    ranking = rank_servers(index_of(), "convert 9am Paris time to the New York time zone")
    assert ranking.recommended == ("time",)
    assert "time" not in ranking.alternatives


def test_a_task_matching_nothing_recommends_nothing_with_zero_confidence() -> None:
    ranking = rank_servers(index_of(), "bake a sourdough loaf")
    assert ranking.recommended == ()
    assert ranking.confidence == 0.0
    assert "no server" in ranking.reasoning


def test_the_reasoning_names_the_matched_words_and_where_they_were_found() -> None:
    ranking = rank_servers(index_of(), "show the git diff")
    assert ranking.reasoning.startswith("git: ")
    assert "git (name)" in ranking.reasoning


def test_a_service_brings_the_services_it_requires() -> None:
    ranking = rank_servers(index_of(), "create a ticket in the issue tracker")
    assert ranking.recommended == ("tracker", "git")
    assert "git: required by tracker" in ranking.reasoning


def test_requirements_come_in_the_order_the_suite_gives_them_with_or_without_a_budget() -> None:
    deploy = ServiceText("deploy", description="deploy things", requires=("git", "time"))
    index = index_of([GIT, TIME, deploy])
    assert rank_servers(index, "deploy things").recommended == ("deploy", "git", "time")
    wide = rank_servers(index, "deploy things", budget=10**6)
    assert wide.recommended == ("deploy", "git", "time")


def test_requirements_that_form_a_cycle_end() -> None:
    a = ServiceText("alpha", description="alpha things", requires=("beta",))
    b = ServiceText("beta", description="beta things", requires=("alpha",))
    ranking = rank_servers(index_of([a, b]), "alpha things")
    assert ranking.recommended == ("alpha", "beta")


def test_a_budget_leaves_out_a_service_whose_tools_do_not_fit_and_says_so() -> None:
    index = index_of()
    both = "what time is it in Tokyo, and show the git commit history"
    full = rank_servers(index, both)
    first = full.recommended[0]
    budget = index.tokens_of([first])
    ranking = rank_servers(index, both, budget=budget)
    assert ranking.recommended == (first,)
    assert len(ranking.left_out) == 1
    assert "over the budget" in ranking.reasoning
    assert sum(ranking.estimated_tokens.values()) <= budget


def test_a_budget_too_small_for_any_service_recommends_none() -> None:
    ranking = rank_servers(index_of(), "show the git log", budget=1)
    assert ranking.recommended == ()
    assert ranking.left_out == ("git",)


def test_estimated_tokens_are_the_services_tool_definitions() -> None:
    ranking = rank_servers(index_of(), "show the git log")
    assert ranking.estimated_tokens == {"git": sum(size(t) for t in GIT.tools)}


def test_another_judges_choice_keeps_requirements_and_the_budget() -> None:
    index = index_of()
    ranking = rank_servers(index, "create a ticket")
    chosen = with_choice(index, ranking, ["tracker"], budget=None, why="the model chose")
    assert chosen.recommended == ("tracker", "git")
    assert chosen.reasoning.startswith("the model chose")


def test_confidence_is_higher_for_a_clear_task_than_for_a_vague_one() -> None:
    index = index_of()
    clear = rank_servers(index, "convert time between time zones").confidence
    vague = rank_servers(index, "show the project").confidence
    assert 0.0 <= vague < clear <= 1.0


def test_confidence_comes_from_the_calibration_given() -> None:
    always = Calibration(bias=30.0, coefficients=())
    assert rank_servers(index_of(), "git log", calibration=always).confidence == 1.0


# --- tools --------------------------------------------------------------------------------------


def test_find_tools_ranks_the_tool_doing_the_job_first() -> None:
    hits = find_tools(index_of(), "make a new branch")
    assert (hits[0].service, hits[0].tool.name) == ("git", "git_create_branch")


def test_find_tools_matches_argument_names() -> None:
    hits = find_tools(index_of(), "event_id")
    assert hits[0].tool.name == "get_stack_trace"


def test_find_tools_honours_the_limit_and_a_service_filter() -> None:
    index = index_of()
    assert len(find_tools(index, "time", limit=1)) == 1
    assert {h.service for h in find_tools(index, "show", services=["git"])} == {"git"}


def test_services_that_score_alike_are_ranked_in_the_suites_order() -> None:
    twins = [
        ServiceText(name, description="Weather forecasts", tools=(tool("forecast", "Forecast"),))
        for name in ("zulu", "alpha", "mike")
    ]
    ranked = rank_servers(index_of(twins), "weather forecast").ranked
    assert [s.name for s in ranked] == ["zulu", "alpha", "mike"]
    assert len({s.score for s in ranked}) == 1


def test_a_services_best_tool_is_the_first_of_its_equally_good_tools() -> None:
    same = ServiceText(
        "maps", tools=(tool("route_b", "Plan a route"), tool("route_a", "Plan a route"))
    )
    ranking = rank_servers(index_of([same, TIME]), "plan a route")
    assert ranking.ranked[0].best_tool == "route_b"
    assert [h.tool.name for h in find_tools(index_of([same, TIME]), "plan a route")] == [
        "route_b",
        "route_a",
    ]


def test_a_ranking_lists_at_most_top_services_and_still_chooses_among_the_candidates() -> None:
    many = [
        ServiceText(f"store{i}", description=f"Key value store number {i}", tools=(tool("put"),))
        for i in range(30)
    ]
    ranking = rank_servers(index_of(many), "key value store", top=3)
    assert [s.name for s in ranking.ranked][:3] == ["store0", "store1", "store2"]
    assert ranking.recommended == ("store0",)


VOCABULARY = ("alpha", "beta", "gamma", "delta", "omega", "sigma", "kappa", "zeta")


def _reference(
    index: Any, query: list[str]
) -> tuple[list[tuple[int, float]], list[tuple[int, float]]]:
    """Every service's and every tool's score by brute force over the whole catalog, terms
    added in the query's order (so the same floats): what the sparse sums must give."""
    totals = []
    for position, service in enumerate(index.services):
        own = 0.0
        for term in query:
            own += index.service_postings.get(term, {}).get(position, 0.0)
            own += index.name_postings.get(term, {}).get(position, 0.0)
        start = index.slot_starts[position]
        slots = range(start, start + max(1, len(service.tools)))
        best = max(
            sum_in_order(index.tool_postings.get(t, {}).get(s, 0.0) for t in query) for s in slots
        )
        totals.append((position, own + index.weights.best_tool * best))
    services = sorted(((p, t) for p, t in totals if t > 0.0), key=lambda x: (-x[1], x[0]))
    tools = []
    for slot, tool_position in enumerate(index.slot_tools):
        value = sum_in_order(index.tool_postings.get(t, {}).get(slot, 0.0) for t in query)
        if tool_position >= 0 and value > 0.0:
            tools.append((slot, value + 0.3 * totals[index.slot_services[slot]][1]))
    return services, sorted(tools, key=lambda x: (-x[1], x[0]))


def sum_in_order(values: Any) -> float:
    total = 0.0
    for value in values:
        if value:
            total += value
    return total


def random_catalog(seed: int) -> tuple[list[tuple[list[str], list[list[str]]]], list[str]]:
    """A small catalog over a few words (so that terms collide and scores tie), and a query."""
    rng = random.Random(seed)

    def words(most: int) -> list[str]:
        return rng.choices(VOCABULARY, k=rng.randint(0, most))

    catalog = [
        (words(4), [words(3) for _ in range(rng.randint(0, 4))]) for _ in range(rng.randint(0, 8))
    ]
    return catalog, rng.choices(VOCABULARY, k=rng.randint(1, 5))


@pytest.mark.parametrize("seed", range(300))
def test_rankings_match_a_brute_force_over_the_whole_catalog(seed: int) -> None:
    catalog, query = random_catalog(seed)
    services = [
        ServiceText(
            f"s{i}",
            description=" ".join(about),
            tools=tuple(tool(f"t{i}x{j}", " ".join(words)) for j, words in enumerate(tools)),
        )
        for i, (about, tools) in enumerate(catalog)
    ]
    index = index_of(services)
    text = " ".join(query)
    expected_services, expected_tools = _reference(index, query_of(index, text))
    ranking = rank_servers(index, text, top=len(services))
    assert [(s.name, s.score) for s in ranking.ranked] == [
        (services[p].name, round(t, 4)) for p, t in expected_services
    ]
    hits = find_tools(index, text, limit=100)
    assert [(h.tool.name, h.score) for h in hits] == [
        (index.tools[index.slot_tools[s]].name, round(v, 4)) for s, v in expected_tools
    ]


def test_an_empty_catalog_ranks_nothing() -> None:
    index = index_of([])
    assert rank_servers(index, "anything").recommended == ()
    assert find_tools(index, "anything") == []


# --- tokens -------------------------------------------------------------------------------------


def test_the_real_tokenizer_loads_offline_and_counts_a_definition() -> None:
    method, count = Tokenizer().load()
    assert method == "cl100k_base"  # the encoding file ships in a package: no download
    assert count("Create a pull request in a GitHub repository") == 8
    definition = tool("git_log", "Show the commit history", "repo_path")
    assert 10 < count_definition(definition) < estimate(definition_text(definition)) * 2


def test_the_orchestrators_tokenizer_counts_in_a_child_process_as_tiktoken_does() -> None:
    _, in_process = Tokenizer().load()  # tiktoken here, in the test's process
    texts = [
        "Create a pull request in a GitHub repository",
        "<|endoftext|> is text here, not a special token",
        'Grüße, 世界 — ∑ {"json": [1, 2]}\nand a second line',
        "",
    ]
    counter = load_in_child()
    try:
        assert [counter(text) for text in texts] == [in_process(text) for text in texts]
    finally:
        forget_child()
    assert counter("after the end") == estimate("after the end")  # gone: the estimate


def test_a_serving_orchestrator_indexes_a_catalog_without_importing_tiktoken() -> None:
    """tiktoken loaded and dropped in-process left 7 MB resident for good, and its load
    peaked 38 MB higher: the orchestrator counts in a child process (see tokens)."""
    program = (
        "import sys\n"
        "from reactor_fabric import _token_counter\n"
        "_token_counter.use()  # as reactor_fabric._serve_cli.serve does\n"
        "from reactor_fabric.protocol.catalog import Catalog, service_catalog\n"
        "from reactor_fabric.protocol.fabric_discovery import index_catalog\n"
        "from reactor_fabric.discovery import tokens\n"
        "tool = {'name': 'git_log', 'description': 'Show the history', 'inputSchema': {}}\n"
        "index = index_catalog(Catalog({'git': service_catalog(tools=[tool])}), {})\n"
        "print(index.all_tokens, tokens.method(), 'tiktoken' in sys.modules,"
        " tokens.TOKENIZER.loaded())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, check=True, timeout=60
    )
    _, in_process = Tokenizer().load()
    definition = {"name": "git_log", "description": "Show the history", "inputSchema": {}}
    expected = in_process(definition_text(definition))
    assert done.stdout.split() == [str(expected), "cl100k_base", "False", "False"]


def test_a_counting_process_that_dies_gives_the_estimate_and_is_reaped() -> None:
    counter = load_in_child()
    [process] = _token_counter._children
    os.kill(process.pid, signal.SIGKILL)
    assert counter("Show the history") == estimate("Show the history")
    assert _token_counter._children == []  # ended and forgotten: the next load starts a new one
    forget_child()


class FakeEncoding:
    """A tokenizer's loader that records what happens to it: loads, forgets, counts."""

    def __init__(self, *, fails: bool = False) -> None:
        self.fails = fails
        self.loads = 0
        self.forgets = 0
        self.counted: list[str] = []

    def load(self) -> Callable[[str], int]:
        self.loads += 1
        if self.fails:
            raise OSError("the encoding file is damaged")

        def count(text: str) -> int:
            self.counted.append(text)
            return len(text)

        return count

    def forget(self) -> None:
        self.forgets += 1

    def tokenizer(self, **kwargs: Any) -> Tokenizer:
        return Tokenizer(self.load, self.forget, **kwargs)


def test_a_batch_of_counts_loads_the_encoding_once_and_drops_it_after() -> None:
    encoding = FakeEncoding()
    tokenizer = encoding.tokenizer()
    with tokenizer.held():
        assert not tokenizer.loaded()  # nothing counted yet: nothing loaded
        counts = [tokenizer.count_definition(tool(f"t{n}", "d", "a")) for n in range(3)]
        assert tokenizer.loaded()
    assert counts == [len(definition_text(tool(f"t{n}", "d", "a"))) for n in range(3)]
    assert (encoding.loads, encoding.forgets) == (1, 1)
    assert not tokenizer.loaded()


def test_definitions_counted_before_are_not_counted_again_and_load_nothing() -> None:
    encoding = FakeEncoding()
    tokenizer = encoding.tokenizer()
    tokenizer.count_all([tool("a", "first"), tool("b", "second")])
    tokenizer.count_all([tool("a", "first"), tool("b", "second")])  # a catalog re-indexed
    assert tokenizer.count_definition(tool("a", "first")) == len(
        definition_text(tool("a", "first"))
    )
    assert (encoding.loads, len(encoding.counted)) == (1, 2)
    # A changed definition is a new one.
    tokenizer.count_definition(tool("a", "first, changed"))
    assert (encoding.loads, len(encoding.counted)) == (2, 3)


def test_a_count_outside_a_batch_drops_the_encoding_at_once() -> None:
    encoding = FakeEncoding()
    tokenizer = encoding.tokenizer()
    tokenizer.count_definition(tool("a", "b"))
    assert not tokenizer.loaded()
    assert (encoding.loads, encoding.forgets) == (1, 1)


def test_the_encoding_stays_until_the_last_of_overlapping_holders_leaves() -> None:
    encoding = FakeEncoding()
    tokenizer = encoding.tokenizer()
    first, second = tokenizer.held(), tokenizer.held()
    first.__enter__()
    second.__enter__()
    tokenizer.count_definition(tool("a", "b"))
    first.__exit__(None, None, None)
    assert tokenizer.loaded()
    tokenizer.count_definition(tool("c", "d"))
    second.__exit__(None, None, None)
    assert not tokenizer.loaded()
    assert (encoding.loads, encoding.forgets) == (1, 1)


def test_an_encoding_that_cannot_be_loaded_means_the_estimate_tried_once() -> None:
    encoding = FakeEncoding(fails=True)
    tokenizer = encoding.tokenizer()
    definition = tool("git_log", "Show the commit history", "repo_path")
    with tokenizer.held():
        assert tokenizer.count_definition(definition) == estimate(definition_text(definition))
    assert tokenizer.method() == "estimate"
    tokenizer.count_definition(tool("x", "y"))
    assert encoding.loads == 1
    assert encoding.forgets == 0  # nothing was loaded to forget


def test_the_method_is_known_after_one_load_and_dropped_with_it() -> None:
    encoding = FakeEncoding()
    tokenizer = encoding.tokenizer(name="fake")
    assert tokenizer.method() == "fake"
    assert tokenizer.method() == "fake"
    assert (encoding.loads, encoding.forgets) == (1, 1)


def test_the_memory_of_counts_is_bounded() -> None:
    encoding = FakeEncoding()
    tokenizer = encoding.tokenizer(memo_limit=4)
    tokenizer.count_all(tool(f"t{n}", "d") for n in range(10))
    tokenizer.count_all(tool(f"t{n}", "d") for n in range(10))
    # Each pass outgrew the memory (started again at 4): every count was made again.
    assert len(encoding.counted) == 20
    tokenizer.count_all(tool(f"t{n}", "d") for n in range(9, 10))
    assert len(encoding.counted) == 20


def test_indexing_a_catalog_leaves_the_real_encoding_out_of_memory() -> None:
    catalog = Catalog({"git": service_catalog(tools=[tool("git_log", "Show the history")])})
    index = index_catalog(catalog, {})
    assert index.all_tokens == count_definition(tool("git_log", "Show the history")) > 0
    assert not tokens.TOKENIZER.loaded()


def test_only_what_a_client_sees_of_a_definition_is_counted() -> None:
    definition = {**tool("a", "b"), "_meta": {"x": "y" * 1000}, "execution": {"taskSupport": "x"}}
    assert "_meta" not in definition_text(definition)


# --- the catalog file ---------------------------------------------------------------------------


def test_a_catalog_file_round_trips() -> None:
    data = json.loads(json.dumps(catalog_json(SUITE)))
    assert services_from_json(data) == SUITE


@pytest.mark.parametrize(
    "data",
    [
        [],
        {"services": []},
        {"services": {"x": []}},
        {"services": {"x": {"tools": {}}}},
        {"services": {"x": {"description": 3}}},
        {"services": {"x": {"keywords": "git"}}},
    ],
)
def test_a_malformed_catalog_file_is_refused_with_where(data: object) -> None:
    with pytest.raises(CatalogFormatError):
        services_from_json(data)


def test_optional_fields_of_a_catalog_file_may_be_absent_or_null() -> None:
    services = services_from_json({"services": {"x": {"description": None, "tools": [tool("t")]}}})
    assert services == [ServiceText("x", tools=(tool("t"),))]


def test_words_stemmed_in_several_threads_at_once_stem_as_in_one() -> None:
    # Distinct words past the cache (stem.__wrapped__), a switch interval short enough that the
    # threads interleave inside a word: a stemmer shared between threads mixes their words up.
    words = [
        f"{root}{suffix}"
        for root in ("connect", "relat", "generat", "index")
        for suffix in (
            "ional",
            "izations",
            "ively",
            "ements",
            "fulness",
            "ications",
            "ousness",
            "ing",
        )
    ] * 40
    alone = [stem.__wrapped__(word) for word in words]
    results: dict[int, list[str] | BaseException] = {}

    def stem_all(n: int) -> None:
        try:
            results[n] = [stem.__wrapped__(word) for word in words]
        except BaseException as exc:
            results[n] = exc

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=stem_all, args=(n,)) for n in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(interval)
    assert all(result == alone for result in results.values()), {
        n: result if isinstance(result, BaseException) else "differs"
        for n, result in results.items()
        if result != alone
    }


def test_the_english_stemmer_is_loaded_alone_and_stems_as_the_package_does() -> None:
    """snowballstemmer's package loads all its 35 languages (2.5 MB): only English's is."""
    words = ["running", "requests", "repositories", "timezone", "generously", "github"]
    program = (
        "import sys\n"
        "from reactor_fabric.discovery.text import stem\n"
        f"print(*[stem(w) for w in {words!r}], 'snowballstemmer' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, check=True, timeout=60
    )
    import snowballstemmer  # noqa: PLC0415 (the package whole, here in the test's process)

    english = snowballstemmer.stemmer("english")
    assert done.stdout.split() == [*(english.stemWord(w) for w in words), "False"]
