"""Which replicas a request's URL can go to.

A request under a replica's base URL (origin and path prefix) means the same under every replica's base: any
replica may take it (`llmguard_client._routing.replicas.rebase` swaps the prefix). A request on a replica's origin
but outside its base path (an Azure client whose base is ``/openai/deployments/dep1`` asking for
``/openai/files``, ``/openai/models`` or another deployment's ``/openai/deployments/emb/embeddings``) means
something only on that origin: it goes there with the path the client built, to the replicas on that origin. A
request on an origin no replica has (a virtual base URL such as ``http://llm.internal/v1``) may go to any.

Such a request on a replica's origin outside every base path (`beside`) speaks for another API or deployment
than the replicas': a cool-down or a circuit of theirs neither holds it back nor learns from its answers (Azure
limits each deployment on its own).

A request whose URL the client signed (`llmguard_client._http.signed`: AWS SigV4 signs the host and the path) can
go only to its own origin, unchanged (`own`): to the replicas there that would send it as it is.

A request for stored state (`stored`: files, batches, vector stores, a stored response...) goes to one replica
of those: the state lives on the server that made it. That is the replica whose base URL the request is under,
else the first on its origin, else the first replica.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import httpx

from llmguard_client._http.urlpath import normal_path, path_under, sent_path

_CACHE = 256
"""Distinct (method, URL) pairs remembered (cleared when full)."""
_VIRTUAL_NOTED = 16
"""Origins no replica has that are noted (and warned of) at most: a bound on what a Guard remembers."""

logger = logging.getLogger("llmguard_client")

STORED_COLLECTIONS = frozenset(
    {
        "assistants",
        "batches",
        "containers",
        "conversations",
        "evals",
        "files",
        "fine_tuning",
        "fine-tunes",
        "threads",
        "uploads",
        "vector_stores",
    }
)
"""Path segments of the OpenAI (and Anthropic) APIs whose objects live on the server that created them."""

_CATALOGUE = "models"
"""Read (GET, DELETE) on the server that holds the models, a fine-tuned one included; a POST under it is a call
(Gemini's ``/models/{model}:generateContent``)."""

_STORED_ANSWERS = ("responses", "completions")
"""Generation paths whose answers a server may store: ``/responses/{id}``, ``GET /chat/completions``."""


def same_origin(url: httpx.URL, base: httpx.URL) -> bool:
    return url.host == base.host and url.port == base.port and url.scheme == base.scheme


def same_base(a: httpx.URL, b: httpx.URL) -> bool:
    """Whether two base URLs name one place: one origin, and one path however spelled (`normal_path`)."""
    return same_origin(a, b) and normal_path(sent_path(a).rstrip("/")) == normal_path(sent_path(b).rstrip("/"))


def relative(path: str, base: httpx.URL) -> str | None:
    """``path`` after ``base``'s path prefix ("" for the base itself) as ``path`` spells it, or None when it is not
    under it; both as sent (`sent_path`), compared as `path_under` does: ``/dep%2Fx`` is one segment, not
    ``/dep/x``, and ``/team@corp`` is ``/team%40corp``."""
    return path_under(path, sent_path(base).rstrip("/"))


def deepest(url: httpx.URL, path: str, bases: Sequence[httpx.URL]) -> tuple[int, str] | None:
    """The index of the base on ``url``'s origin whose path ``path`` (``url``'s, as sent) is under with the most
    segments, and what follows it there (`relative`), or None: with ``/v1`` and ``/v1/x`` on one origin,
    ``/v1/x/chat/completions`` is ``/v1/x``'s, ``/chat/completions`` after it."""
    found: tuple[int, str] | None = None
    depth = -1
    for i, base in enumerate(bases):
        if not same_origin(url, base):
            continue
        prefix = sent_path(base).rstrip("/")
        rest = path_under(path, prefix)
        if rest is not None and prefix.count("/") > depth:
            found, depth = (i, rest), prefix.count("/")
    return found


def stored(method: str, path: str) -> bool:
    """Whether a request reads or writes state kept by the server that answers it: a path with a segment naming
    stored objects (``/files``, ``/batches``, ``/vector_stores``...; a deployment's name is not read), a read of
    ``/models``, a stored answer (``/responses/{id}``, ``/chat/completions/{id}``) or a read of a generation
    path (``GET /chat/completions`` lists the stored ones). A generation call (``POST /responses``) is not."""
    segments = [s for s in path.split("/") if s]
    for i, segment in enumerate(segments):
        if i and segments[i - 1] == "deployments":
            continue  # an Azure deployment's name, whatever it is
        if segment in STORED_COLLECTIONS or (segment == _CATALOGUE and method != "POST"):
            return True
        if segment in _STORED_ANSWERS and (i + 1 < len(segments) or method != "POST"):
            return True
    return False


def beside(url: httpx.URL, bases: Sequence[httpx.URL]) -> bool:
    """Whether ``url`` is on a replica's origin but under none of the ``bases`` (another deployment of an Azure
    resource, its ``/openai/files``): what it gets answered says nothing of the replicas' own calls."""
    path = sent_path(url)
    on_origin = [base for base in bases if same_origin(url, base)]
    return bool(on_origin) and all(relative(path, base) is None for base in on_origin)


def outside(method: str, url: httpx.URL, bases: Sequence[httpx.URL]) -> tuple[int, ...]:
    """The indices of the ``bases`` a request for ``url`` must not go to (see the module's docstring)."""
    path = sent_path(url)
    under = deepest(url, path, bases)
    if under is not None:
        index, rest = under
        reach = [index] if stored(method, rest) else range(len(bases))
    else:
        on_origin = [i for i, base in enumerate(bases) if same_origin(url, base)]
        if on_origin:
            reach = on_origin[:1] if stored(method, path) else on_origin
        else:
            reach = [0] if stored(method, path) else range(len(bases))
    kept = set(reach)
    return tuple(i for i in range(len(bases)) if i not in kept)


def own(url: httpx.URL, bases: Sequence[httpx.URL]) -> tuple[int, ...]:
    """The indices of the ``bases`` that send a request for ``url`` as it is (`llmguard_client._routing.replicas.rebase`
    keeps it): on its origin, with the base path of the `deepest` base it is under, however spelled (all on its
    origin if it is under none); none when its origin is no replica's."""
    on_origin = [i for i, base in enumerate(bases) if same_origin(url, base)]
    under = deepest(url, sent_path(url), bases)
    if under is None:
        return tuple(on_origin)
    return tuple(i for i in on_origin if same_base(bases[i], bases[under[0]]))


class Reach:
    """`outside` and `beside` for one replica set's bases, cached: a service calls few distinct paths. It also notes the
    origins no replica has (virtual base URLs): a second one is most likely a client meant for another service
    (a copy of the client with another ``base_url``), whose requests, and API key, go to the replicas: logged
    once per such origin."""

    def __init__(self, bases: Sequence[httpx.URL]) -> None:
        self._bases = tuple(bases)
        self._cache: dict[tuple[str, str, str, int | None, bytes, bool], tuple[tuple[int, ...], bool]] = {}
        self._virtual: list[tuple[str, str, int | None]] = []
        """The origins no replica has that requests named, in order (at most `_VIRTUAL_NOTED`)."""

    def where(self, method: str, url: httpx.URL, signed: bool = False) -> tuple[tuple[int, ...], bool]:
        """(`outside`, `beside`) of a request; ``signed``: its URL is signed, so the replicas that would change it
        (every one but its `own`) are outside too."""
        key = (method, url.scheme, url.host, url.port, url.raw_path, signed)
        found = self._cache.get(key)
        if found is None:
            if len(self._cache) >= _CACHE:
                self._cache.clear()
            if not signed:
                self._note_origin(url)
            out = outside(method, url, self._bases) if len(self._bases) > 1 else ()
            if signed:
                kept = own(url, self._bases)
                out = tuple(i for i in range(len(self._bases)) if i in out or i not in kept)
            found = self._cache[key] = (out, beside(url, self._bases))
        return found

    def serves_signed(self, url: httpx.URL) -> bool:
        """Whether a replica sends a signed request for ``url`` as it is (see `own`)."""
        return bool(own(url, self._bases))

    def _note_origin(self, url: httpx.URL) -> None:
        origin = (url.scheme, url.host, url.port)
        if origin in self._virtual or len(self._virtual) >= _VIRTUAL_NOTED:
            return
        if any(same_origin(url, base) for base in self._bases):
            return
        self._virtual.append(origin)
        if len(self._virtual) > 1:
            first = self._virtual[0]
            logger.warning(
                "llmguard: requests for %s://%s are sent to the replicas, with their headers (API keys included), "
                "as those for %s://%s are: neither host is a replica. If the second client is meant for another "
                "service, give it its own HTTP client, not the guard's",
                url.scheme,
                url.netloc.decode("ascii"),
                first[0],
                first[1] if first[2] is None else f"{first[1]}:{first[2]}",
            )
