"""PEM: heavy-hitter discovery over an open string domain by prefix extension.

Wang, Li, Lin, Jha, "Locally Differentially Private Heavy Hitter
Identification", IEEE TDSC 2019, Section IV (the Prefix Extending Method). A
value is a string of 1..L UTF-8 bytes without NUL (`OpenDomain`, L =
max_bytes); it is encoded as its bytes padded with zero bytes to L (the first
zero byte ends the string), i.e. a string of M = 8L bits, read most
significant bit of byte 0 first.

Groups and prefixes (policy params, all stated in the signed policy)
--------------------------------------------------------------------
* "step_bits" η in {1, 2, 4, 8}, "start_bits" γ >= 0 with γ + η <= 16,
* "groups" G = (M - γ) / η (an integer >= 1; the policy must state exactly it),
* "g" the hash range, a power of two 2..2^31.

Group j (0 <= j < G) reports the prefix of its users' strings of length
ℓ_j = γ + (j + 1) η bits; the last group's prefix is the whole padded string.
The device draws its group uniformly, j = randrange(G), with its CSPRNG: the
draw does not depend on the value, so it costs no privacy, and a user sends
ONE report per window charged the full ε (the ledger charges each report once;
a policy whose epsilon_cap allows more reports lets a user send more, each a
fresh group draw, composed sequentially and charged each).

Each report is optimized local hashing of the prefix (Wang, Blocki, Li, Jha,
USENIX Security 2017, Section 4.4): the device draws a uniform hash key, hashes
its group's prefix into [0, g) and keeps the hash with probability
p = e^ε / (e^ε + g - 1), otherwise reports one of the g - 1 other values
uniformly (`olh.respond`; p rounded down to a multiple of 2^-53 by
`olh.keep_probability`, so the realized ratio p (g - 1) / (1 - p) <= e^ε
exactly). P[(j, key, y) | v] = (1/G)(1/|keys|)(p if y = h_key(prefix_j(v))
else (1 - p)/(g - 1)): the ratio over two values is at most p(g - 1)/(1 - p).

Hash family (the contract; wire: GroupHashedPayload)
-----------------------------------------------------
Let c = ceil(L / 4). The prefix of ℓ bits is the padded string with every bit
after the first ℓ set to zero, extended with zero bytes to 4c bytes and cut
into c 32-bit chunks x_0..x_{c-1}, x_i = the little-endian value of bytes
4i..4i+3. The key is 8(c + 1) bytes: c + 1 little-endian 64-bit words
a_0..a_{c-1}, b, drawn uniformly. With g = 2^l,

    h_key(x) = ((b + Σ_i a_i x_i) mod 2^64) >> (64 - l).

This is vector multiply-add-shift (Dietzfelbinger, "Universal hashing and
k-wise independent random variables via integer arithmetic without primes",
STACS 1996; Thorup, "High Speed Hashing for Integers and Strings", 2015,
Section 3.5): with w = 32-bit chunks and 64 >= w + l - 1 it is strongly
universal, (h(x), h(x')) uniform on [0, g)^2 for x != x', so two distinct
prefixes collide with probability exactly 1/g (checked exhaustively for small
word sizes in the tests). Integer arithmetic only; no hashing library.

Estimator (Wang et al. 2017, Section 3 eq. (2); TDSC 2019, Section IV-B)
------------------------------------------------------------------------
A report of group j supports a candidate prefix x of length ℓ_j when
h_key(x) = y: with probability p when the user's prefix is x and exactly 1/g
otherwise. With n_j reports in group j and C(x) of them supporting x,
f̂_x = (C(x)/n_j - 1/g) / (p - 1/g) is unbiased for the fraction of group j's
users whose prefix is x, with variance
(f p (1 - p) + (1 - f)(1/g)(1 - 1/g)) / (n_j (p - 1/g)^2) (`support_variance`).
Group membership is a uniform random sample of the n users, so the group's
fraction estimates the population's, adding (given n_j) the hypergeometric
term f (1 - f)(n - n_j) / (n_j (n - 1)) (`estimate_prefixes`, `population`).

Statistic. Local hashing keeps no finite sufficient statistic over an open
domain: the statistic is the multiset of every report, per group, as packed
records of 8(c + 1) key bytes and the 4-byte little-endian value
(8c + 12 bytes per report). Merging is concatenation (exact). Two stored forms:

* chunks (`statistic_chunk`, what the collector appends, one chunk row per
  commit: `chunked_statistic`): each report as a record of its group (2 bytes,
  little-endian), then its key and value (8c + 14 bytes; 30 at L = 8); chunks
  concatenate into a chunk, so a window's statistic is its chunks read back in
  bulk (`statistic_from_chunks`, numpy), and a commit writes only its own reports;
* JSON (`statistic_to_json`: each group's records sorted bytewise, base64; any
  merge order gives the same text): exports, audits, and windows stored before
  chunks (ledger migration 0008).

`estimate` is the frequency of every first-level prefix (ℓ_0 bits) from group 0;
discovery (`fedldp.aggregator.discovery`) extends prefixes level by level.

Batch layout: (groups int64 [n], keys uint64 [n, c + 1], values int64 [n]).
"""

from __future__ import annotations

import base64
import binascii
import json
import random
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from fedldp.client.mechanisms._common import exp_epsilon, support_variance
from fedldp.client.mechanisms.base import (
    Estimate,
    GroupHashedOutput,
    Mechanism,
    OpenDomain,
    Output,
    OutputDomainError,
    system_random,
)
from fedldp.client.mechanisms.olh import (
    keep_probability,
    lh_variance_f0,
    respond,
    respond_batch,
)

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

#: Bits per extension step a policy may choose.
STEP_BITS = (1, 2, 4, 8)
#: Largest first-level prefix (γ + η bits): 2^16 candidates at the first level.
MAX_FIRST_BITS = 16
#: Most groups a policy may declare.
MAX_GROUPS = 512
#: Largest hash range exponent l (g = 2^l); 64 >= 32 + l - 1 keeps the family strongly universal.
MAX_HASH_BITS = 31
#: Hash word and chunk sizes of the contract.
WORD_BITS = 64
CHUNK_BITS = 32
_WORD_MASK = (1 << WORD_BITS) - 1
#: Default extension step and start (stated into the policy at authoring).
DEFAULT_STEP_BITS = 4
DEFAULT_START_BITS = 4


def chunk_count(max_bytes: int) -> int:
    """c = ceil(L / 4): 32-bit chunks of a padded string."""
    return (max_bytes + 3) // 4


def key_length(max_bytes: int) -> int:
    """Bytes of a hash key: c + 1 64-bit words."""
    return 8 * (chunk_count(max_bytes) + 1)


def multiply_add_shift(
    a: Sequence[int], b: int, x: Sequence[int], out_bits: int, word_bits: int = WORD_BITS
) -> int:
    """((b + Σ a_i x_i) mod 2^word_bits) >> (word_bits - out_bits): the contract's hash
    (word_bits = 64, 32-bit x_i), parameterized so tests can check it exhaustively."""
    acc = b
    for ai, xi in zip(a, x, strict=True):
        acc += ai * xi
    return (acc & ((1 << word_bits) - 1)) >> (word_bits - out_bits)


def prefix_chunks(padded: bytes, bits: int) -> list[int]:
    """The 32-bit chunks of the first `bits` bits of `padded` (later bits zeroed)."""
    whole, extra = divmod(bits, 8)
    data = bytearray(padded[:whole])
    if extra:
        data.append(padded[whole] & (0xFF << (8 - extra)) & 0xFF)
    data.extend(bytes(4 * chunk_count(len(padded)) - len(data)))
    return [int.from_bytes(data[i : i + 4], "little") for i in range(0, len(data), 4)]


def hash_key(key: bytes, chunks: Sequence[int], out_bits: int) -> int:
    """h_key(x) for a key of c + 1 little-endian words and the c chunks of x."""
    words = struct.unpack(f"<{len(chunks) + 1}Q", key)
    return multiply_add_shift(words[:-1], words[-1], chunks, out_bits)


def default_g(epsilon: Decimal) -> int:
    """The power of two g with the least f = 0 variance of local hashing at ε (ties: smaller)."""
    e = exp_epsilon(epsilon)
    best = min(range(1, MAX_HASH_BITS + 1), key=lambda bits: (lh_variance_f0(e, 1 << bits), bits))
    return 1 << best


def derive_params(max_bytes: int, epsilon: Decimal, params: dict[str, str]) -> dict[str, str]:
    """`params` with every PEM parameter this policy would use written in (authoring).

    Invalid input comes back unchanged; validation reports it.
    """
    step = _int_param(params, "step_bits", DEFAULT_STEP_BITS)
    start = _int_param(params, "start_bits", DEFAULT_START_BITS)
    if step is None or start is None or step <= 0:
        return dict(params)
    stated = dict(params)
    stated.setdefault("step_bits", str(step))
    stated.setdefault("start_bits", str(start))
    if (8 * max_bytes - start) % step == 0:
        stated.setdefault("groups", str((8 * max_bytes - start) // step))
    try:
        stated.setdefault("g", str(default_g(epsilon)))
    except ValueError:
        return dict(params)
    return stated


def _int_param(params: dict[str, str], name: str, default: int) -> int | None:
    text = params.get(name)
    if text is None:
        return default
    if not isinstance(text, str) or not text.isascii() or not text.isdigit() or len(text) > 10:
        return None
    return int(text)


@dataclass
class GroupReports:
    """Every report, per group, as packed records (key bytes, then the value as 4 LE bytes).

    `n` counts the reports of all groups. Merging concatenates (exact).
    """

    records: list[bytearray]
    record_size: int
    n: int = 0

    def merge(self, other: GroupReports) -> None:
        """Add another partial statistic in place."""
        if len(other.records) != len(self.records) or other.record_size != self.record_size:
            raise ValueError("cannot merge statistics of different group layouts")
        for mine, theirs in zip(self.records, other.records, strict=True):
            mine.extend(theirs)
        self.n += other.n

    def group_size(self, group: int) -> int:
        """Reports in `group`."""
        return len(self.records[group]) // self.record_size


class PEM(Mechanism[str, GroupReports]):
    """Prefix Extending Method with local hashing (TDSC 2019, Section IV)."""

    wire_id = "pem"
    chunked_statistic = True

    def __init__(
        self,
        epsilon: Decimal,
        domain: OpenDomain,
        *,
        step_bits: int = DEFAULT_STEP_BITS,
        start_bits: int = DEFAULT_START_BITS,
        groups: int | None = None,
        g: int | None = None,
    ) -> None:
        super().__init__(epsilon)
        if not isinstance(domain, OpenDomain):
            raise ValueError("pem needs an open-domain metric ([metric] max_bytes = N)")
        self.domain = domain
        self.max_bytes = domain.max_bytes
        total = 8 * self.max_bytes
        if step_bits not in STEP_BITS:
            raise ValueError(f"pem step_bits must be one of {STEP_BITS}, got {step_bits}")
        if not 0 <= start_bits <= MAX_FIRST_BITS - step_bits:
            raise ValueError(
                f"pem start_bits must be in [0, {MAX_FIRST_BITS - step_bits}] "
                f"(start_bits + step_bits <= {MAX_FIRST_BITS})"
            )
        if start_bits + step_bits > total or (total - start_bits) % step_bits:
            raise ValueError(
                f"pem needs (8 * max_bytes - start_bits) = {total - start_bits} to be a "
                f"positive multiple of step_bits = {step_bits}"
            )
        derived = (total - start_bits) // step_bits
        if groups is not None and groups != derived:
            raise ValueError(
                f"pem groups must be (8 * max_bytes - start_bits) / step_bits = {derived}, "
                f"got {groups}"
            )
        if derived > MAX_GROUPS:
            raise ValueError(f"pem would need {derived} groups (at most {MAX_GROUPS})")
        if g is None:
            g = default_g(epsilon)
        if isinstance(g, bool) or not isinstance(g, int) or g < 2 or g & (g - 1):
            raise ValueError(f"pem hash range g must be a power of two in [2, 2^31], got {g!r}")
        if g.bit_length() - 1 > MAX_HASH_BITS:
            raise ValueError("pem hash range g must be at most 2^31")
        self.step_bits = step_bits
        self.start_bits = start_bits
        self.groups = derived
        self.g = g
        self.hash_bits = g.bit_length() - 1
        self.chunks = chunk_count(self.max_bytes)
        self.key_bytes = key_length(self.max_bytes)
        self.record_size = self.key_bytes + 4
        self.keep = keep_probability(epsilon, g)
        self.p_exact = self.keep.exact
        self.q_exact = (1 - self.p_exact) / (g - 1)
        self.p = float(self.p_exact)
        self.support_q = 1.0 / g

    # --- layout ---

    def prefix_bits(self, group: int) -> int:
        """ℓ_j = start_bits + (j + 1) step_bits."""
        return self.start_bits + (group + 1) * self.step_bits

    def pad(self, value: str) -> bytes:
        """The value's UTF-8 bytes padded with zero bytes to max_bytes (validated)."""
        data = self.domain.encode(value)
        return data + bytes(self.max_bytes - len(data))

    # --- device ---

    def perturb(self, value: str, *, rng: random.Random | None = None) -> GroupHashedOutput:
        padded = self.pad(value)
        r = rng if rng is not None else system_random()
        group = r.randrange(self.groups)
        key = r.getrandbits(8 * self.key_bytes).to_bytes(self.key_bytes, "little")
        hashed = hash_key(key, prefix_chunks(padded, self.prefix_bits(group)), self.hash_bits)
        return GroupHashedOutput(group, key, respond(self.keep, hashed, self.g, r))

    # --- collector ---

    def check_output(self, output: Output) -> None:
        if not isinstance(output, GroupHashedOutput):
            raise OutputDomainError("WRONG_PAYLOAD_TYPE", "pem expects a group-hashed payload")
        if not 0 <= output.group < self.groups:
            raise OutputDomainError("OUT_OF_DOMAIN", f"pem group outside [0, {self.groups})")
        if not isinstance(output.key, bytes) or len(output.key) != self.key_bytes:
            raise OutputDomainError(
                "WRONG_LENGTH", f"pem hash key must be exactly {self.key_bytes} bytes"
            )
        if not 0 <= output.value < self.g:
            raise OutputDomainError("OUT_OF_DOMAIN", f"pem hash value outside [0, {self.g})")

    def new_statistic(self) -> GroupReports:
        return GroupReports([bytearray() for _ in range(self.groups)], self.record_size)

    def accumulate(self, statistic: GroupReports, output: Output) -> None:
        self.check_output(output)
        assert isinstance(output, GroupHashedOutput)
        statistic.records[output.group] += output.key + struct.pack("<I", output.value)
        statistic.n += 1

    def statistic_to_json(self, statistic: GroupReports) -> str:
        """{"n", "groups": [base64 of the group's records sorted bytewise]} (canonical)."""
        import numpy as np

        size = statistic.record_size
        groups = []
        for buf in statistic.records:
            # Fixed-width byte strings: numpy orders them as bytes do (a trailing zero
            # byte is padding to numpy, but every record has the same width).
            records = np.sort(np.frombuffer(bytes(buf), dtype=f"S{size}"))
            groups.append(base64.b64encode(records.tobytes()).decode("ascii"))
        return json.dumps({"n": statistic.n, "groups": groups}, separators=(",", ":"))

    def statistic_from_json(self, text: str) -> GroupReports:
        """Inverse of `statistic_to_json`; ValueError on a malformed or foreign statistic.

        Refused (no value from the text is echoed): not exactly `groups` groups (so
        every record's group is in range), a group that is not base64 or holds a
        partial record (so every hash key is exactly `key_bytes` long), a record whose
        hash value is outside [0, g) (no report produces one, `check_output`), and an
        `n` that is not an integer (a JSON bool is not a count) or differs from the
        record count."""
        data = json.loads(text)
        groups = data.get("groups") if isinstance(data, dict) else None
        if not isinstance(groups, list) or len(groups) != self.groups:
            raise ValueError(f"a pem statistic has exactly {self.groups} groups")
        statistic = self.new_statistic()
        for j, encoded in enumerate(groups):
            statistic.records[j] += self._group_records(j, encoded)
        statistic.n = sum(statistic.group_size(j) for j in range(self.groups))
        n = data.get("n")
        if not isinstance(n, int) or isinstance(n, bool):
            raise ValueError("pem statistic n is not an integer")
        if n != statistic.n:
            raise ValueError("pem statistic n differs from its record count")
        return statistic

    def _group_records(self, group: int, encoded: object) -> bytes:
        """One group's records decoded and checked (`statistic_from_json`)."""
        if not isinstance(encoded, str):
            raise ValueError(f"pem statistic group {group} is not base64 text")
        try:
            raw = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            raise ValueError(f"pem statistic group {group} is not base64") from None
        if len(raw) % self.record_size:
            raise ValueError(f"pem statistic group {group} has a partial record")
        import numpy as np

        values = np.frombuffer(raw, dtype=self._record_dtype(group_field=False))["value"]
        if values.size and int(values.max()) >= self.g:
            raise ValueError(
                f"pem statistic group {group} holds a hash value outside [0, {self.g})"
            )
        return raw

    # --- chunks: the collector's append-only form (module docstring) ---

    def _record_dtype(self, *, group_field: bool) -> np.dtype[Any]:
        """A packed record: [group <u2,] key <u8 [c + 1], value <u4."""
        import numpy as np

        fields: list[Any] = [("group", "<u2")] if group_field else []
        fields += [("key", "<u8", (self.chunks + 1,)), ("value", "<u4")]
        return np.dtype(fields)

    def statistic_chunk(self, statistic: GroupReports) -> bytes:
        """Every report of `statistic` as a chunk record: its group (2 bytes, little-
        endian), key and value. Pure Python (the collector runs it once per commit on
        that commit's reports)."""
        size = statistic.record_size
        out = bytearray()
        for group, buf in enumerate(statistic.records):
            head = group.to_bytes(2, "little")
            for offset in range(0, len(buf), size):
                out += head
                out += buf[offset : offset + size]
        return bytes(out)

    def chunk_count(self, data: bytes) -> int:
        """Reports in concatenated chunks; ValueError on a partial record."""
        count, extra = divmod(len(data), self.record_size + 2)
        if extra:
            raise ValueError("pem statistic chunks end in a partial record")
        return count

    def statistic_from_chunks(self, data: bytes) -> GroupReports:
        """The statistic of concatenated chunks, each group's records in chunk order.

        Refused (ValueError; no value from `data` is echoed), as `statistic_from_json`
        refuses them: a partial record, a group outside [0, groups), a hash value
        outside [0, g)."""
        import numpy as np

        n = self.chunk_count(data)
        records = np.frombuffer(data, dtype=self._record_dtype(group_field=True))
        statistic = self.new_statistic()
        if not n:
            return statistic
        groups = records["group"]
        if int(groups.max()) >= self.groups:
            raise ValueError(f"pem statistic chunk holds a group outside [0, {self.groups})")
        if int(records["value"].max()) >= self.g:
            raise ValueError(f"pem statistic chunk holds a hash value outside [0, {self.g})")
        order = np.argsort(groups, kind="stable")
        packed = np.empty(n, dtype=self._record_dtype(group_field=False))
        packed["key"] = records["key"][order]
        packed["value"] = records["value"][order]
        raw = packed.tobytes()
        end = 0
        for group, count in enumerate(np.bincount(groups, minlength=self.groups).tolist()):
            start, end = end, end + count * self.record_size
            statistic.records[group] += raw[start:end]
        statistic.n = n
        return statistic

    # --- estimation ---

    def group_arrays(
        self, statistic: GroupReports, group: int
    ) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.uint64]]:
        """(keys uint64 [n_j, c + 1], values uint64 [n_j]) of one group's reports."""
        import numpy as np

        records = np.frombuffer(
            bytes(statistic.records[group]), dtype=self._record_dtype(group_field=False)
        )
        return (
            np.ascontiguousarray(records["key"]).astype(np.uint64),
            records["value"].astype(np.uint64),
        )

    def prefix_words(self, prefixes: Sequence[int], bits: int) -> npt.NDArray[np.uint64]:
        """The 32-bit chunks (as uint64 [m, c]) of prefixes given as `bits`-bit integers."""
        import numpy as np

        width = 4 * self.chunks
        shift = 8 * width - bits
        raw = b"".join((int(x) << shift).to_bytes(width, "big") for x in prefixes)
        data = np.frombuffer(raw, dtype=np.uint8).reshape(len(prefixes), width)
        return np.ascontiguousarray(data).view("<u4").astype(np.uint64)

    def support_counts(
        self,
        keys: npt.NDArray[np.uint64],
        values: npt.NDArray[np.uint64],
        x: npt.NDArray[np.uint64],
    ) -> npt.NDArray[np.int64]:
        """C(x) for each candidate row of chunks x [m, c]: reports with h_key(x) = value."""
        import numpy as np

        n, m = keys.shape[0], x.shape[0]
        used = [i for i in range(self.chunks) if x.size and bool(np.any(x[:, i]))]
        counts = np.zeros(m, dtype=np.int64)
        block = max(1, (1 << 22) // max(1, m))
        for start in range(0, n, block):
            k = keys[start : start + block]
            acc = np.repeat(k[:, self.chunks][:, None], m, axis=1)
            for i in used:
                acc += k[:, i][:, None] * x[:, i][None, :]  # uint64: mod 2^64
            hits = self.top_bits(acc) == values[start : start + block][:, None]
            counts += hits.sum(axis=0)
        return counts

    def estimate_prefixes(
        self,
        statistic: GroupReports,
        group: int,
        prefixes: Sequence[int],
        *,
        population: int | None = None,
    ) -> Estimate:
        """Unbiased frequencies of `prefixes` (ℓ_group-bit integers) from `group`'s reports.

        Variance: the local-hashing term at the estimate clipped to [0, 1]
        (`support_variance`, q = 1/g), plus, with `population` = n, the
        hypergeometric term of the group's sampling (module docstring).
        """
        import numpy as np

        n_j = statistic.group_size(group)
        if n_j == 0:
            raise ValueError(f"pem group {group} has no reports")
        keys, values = self.group_arrays(statistic, group)
        x = self.prefix_words(prefixes, self.prefix_bits(group))
        counts = self.support_counts(keys, values, x)
        q = self.support_q
        f = (counts / n_j - q) / (self.p - q)
        clipped = np.clip(f, 0.0, 1.0)
        variances = support_variance(n_j, clipped, self.p, q)
        if population is not None and population > 1:
            variances = variances + clipped * (1 - clipped) * (population - n_j) / (
                n_j * (population - 1)
            )
        return Estimate(n=n_j, values=np.asarray(f, dtype=np.float64), variances=variances)

    def estimate(self, statistic: GroupReports) -> Estimate:
        """Frequencies of every first-level prefix (ℓ_0 bits, index = the prefix's value),
        from group 0 (`estimate_prefixes`). Discovery: `fedldp.aggregator.discovery`."""
        return self.estimate_prefixes(
            statistic, 0, range(1 << self.prefix_bits(0)), population=statistic.n
        )

    # --- batch paths ---

    def encode_batch(self, values: Any) -> npt.NDArray[np.uint8]:
        """Padded strings as uint8 [n, L]: from a uint8 array as is, else each str encoded."""
        import numpy as np

        if isinstance(values, np.ndarray) and values.dtype == np.uint8 and values.ndim == 2:
            if values.shape[1] != self.max_bytes:
                raise ValueError(f"padded values must have {self.max_bytes} bytes each")
            return values
        distinct: dict[str, bytes] = {}
        rows = []
        for v in values:
            padded = distinct.get(v)
            if padded is None:
                padded = distinct[v] = self.pad(v)
            rows.append(padded)
        return np.frombuffer(b"".join(rows), dtype=np.uint8).reshape(len(rows), self.max_bytes)

    def prefix_rows(self, padded: npt.NDArray[np.uint8], bits: int) -> npt.NDArray[np.uint64]:
        """The 32-bit chunks (uint64 [n, c]) of the first `bits` bits of padded rows."""
        import numpy as np

        width = 4 * self.chunks
        data = np.zeros((padded.shape[0], width), dtype=np.uint8)
        data[:, : self.max_bytes] = padded
        mask = np.zeros(width, dtype=np.uint8)
        whole, extra = divmod(bits, 8)
        mask[:whole] = 0xFF
        if extra:
            mask[whole] = (0xFF << (8 - extra)) & 0xFF
        data &= mask
        return np.ascontiguousarray(data).view("<u4").astype(np.uint64)

    def hash_rows(
        self, keys: npt.NDArray[np.uint64], chunks: npt.NDArray[np.uint64]
    ) -> npt.NDArray[np.int64]:
        """h_key(x) row by row (keys [n, c + 1], chunks [n, c])."""
        import numpy as np

        acc = keys[:, self.chunks].copy()
        for i in range(self.chunks):
            acc += keys[:, i] * chunks[:, i]
        return self.top_bits(acc).astype(np.int64)

    def support_window(
        self, values: npt.NDArray[np.uint64]
    ) -> tuple[npt.NDArray[np.uint64], np.uint64]:
        """(o, w) with `top_bits(acc) == v` exactly when (acc - o_v) mod 2^64 < w:
        o_v = v · 2^(64-l) and w = 2^(64-l) (for v < g, acc in [v w, (v + 1) w) is
        the interval whose top l bits are v; with any other acc, acc - o_v wraps or
        is at least w). What discovery counts support with
        (`fedldp.aggregator.discovery.level_counts`)."""
        import numpy as np

        shift = np.uint64(WORD_BITS - self.hash_bits)
        return np.asarray(values, dtype=np.uint64) << shift, np.uint64(1) << shift

    def top_bits(self, acc: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
        """The hash value from b + Σ a_i x_i mod 2^64: its top l bits (where the device's
        batch path and the reference analysis take them; discovery's fast path uses the
        equivalent `support_window`)."""
        import numpy as np

        return np.asarray(acc >> np.uint64(WORD_BITS - self.hash_bits), dtype=np.uint64)

    def perturb_batch(
        self, values: Any, rng: np.random.Generator
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.uint64], npt.NDArray[np.int64]]:
        """(groups, keys, values) for a batch of strings (or padded uint8 rows); same law."""
        import numpy as np

        padded = self.encode_batch(values)
        n = padded.shape[0]
        groups = np.asarray(rng.integers(0, self.groups, size=n), dtype=np.int64)
        top = np.uint64(_WORD_MASK)
        keys = rng.integers(0, top, size=(n, self.chunks + 1), dtype=np.uint64, endpoint=True)
        hashed = np.empty(n, dtype=np.int64)
        for j in range(self.groups):
            rows = np.flatnonzero(groups == j)
            if rows.size:
                chunks = self.prefix_rows(padded[rows], self.prefix_bits(j))
                hashed[rows] = self.hash_rows(keys[rows], chunks)
        return groups, keys, respond_batch(self.keep, hashed, self.g, rng)

    def accumulate_batch(self, statistic: GroupReports, outputs: Any) -> None:
        """Add (groups, keys, values) arrays, as from `perturb_batch`."""
        import numpy as np

        groups, keys, values = outputs
        groups = np.asarray(groups, dtype=np.int64)
        keys = np.asarray(keys, dtype=np.uint64)
        values = np.asarray(values, dtype=np.int64)
        n = groups.shape[0]
        if keys.shape != (n, self.chunks + 1) or values.shape != (n,):
            raise OutputDomainError("WRONG_LENGTH", "pem batch arrays have the wrong shapes")
        if n and (
            groups.min() < 0
            or groups.max() >= self.groups
            or values.min() < 0
            or values.max() >= self.g
        ):
            raise OutputDomainError("OUT_OF_DOMAIN", "pem report outside its output domain")
        records = np.empty(n, dtype=self._record_dtype(group_field=False))
        records["key"] = keys
        records["value"] = values
        for j in range(self.groups):
            statistic.records[j] += records[groups == j].tobytes()
        statistic.n += n

    def supports_batch(self, outputs: Any, value: str) -> npt.NDArray[np.bool_]:
        """Whether each report supports `value`'s prefix at its group's length."""
        import numpy as np

        groups, keys, values = outputs
        padded = self.encode_batch([value])
        out = np.zeros(groups.shape[0], dtype=bool)
        for j in range(self.groups):
            rows = np.flatnonzero(groups == j)
            if rows.size:
                chunks = np.repeat(self.prefix_rows(padded, self.prefix_bits(j)), rows.size, axis=0)
                out[rows] = self.hash_rows(keys[rows], chunks) == values[rows]
        return out

    def support_rate(self, value: str, truth: str) -> float:
        """P[a report of `truth` supports `value`'s prefix]: the mean over the groups of
        p (same prefix) or 1/g (another prefix, strongly universal hash)."""
        a, b = self.pad(value), self.pad(truth)
        same = sum(
            prefix_chunks(a, self.prefix_bits(j)) == prefix_chunks(b, self.prefix_bits(j))
            for j in range(self.groups)
        )
        return (same * self.p + (self.groups - same) * self.support_q) / self.groups

    # --- tests ---

    def exact_probability(self, value: str, output: Output) -> Fraction:
        """P[perturb(value) == output] exactly, from the sampler's integer threshold."""
        assert isinstance(output, GroupHashedOutput)
        self.check_output(output)
        chunks = prefix_chunks(self.pad(value), self.prefix_bits(output.group))
        hashed = hash_key(output.key, chunks, self.hash_bits)
        mass = self.p_exact if output.value == hashed else self.q_exact
        return mass / (self.groups * (1 << (8 * self.key_bytes)))

    def outputs_for_key(self, key: bytes) -> Iterator[GroupHashedOutput]:
        """Every output with hash key `key` (the key is uniform and value-independent)."""
        for group in range(self.groups):
            for y in range(self.g):
                yield GroupHashedOutput(group, key, y)


__all__ = [
    "PEM",
    "GroupReports",
    "chunk_count",
    "default_g",
    "derive_params",
    "hash_key",
    "key_length",
    "multiply_add_shift",
    "prefix_chunks",
]
