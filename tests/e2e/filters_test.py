"""Filters, counts, scrolls, deletes by filter, attributes in hits and grouped results against the
real tessera-server on loopback, through the Python client: random nested filters (any_of /
none_of, exists / missing, prefix) select through count, scroll, exhaustive search and delete
exactly what a brute-force evaluator in Python selects; deletes by filter acknowledged before a
SIGKILL are all gone after the restart (and nothing else is); grouped results equal a brute-force
grouping of exact MaxSim over the stored vectors; hits' attributes equal Get's; bad input is
INVALID_ARGUMENT naming the field, the value and what was expected."""

import os
import sys
import threading

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import e2e_util  # noqa: E402
from e2e_util import grpc, tessera  # noqa: E402

DIM = 16
LANGS = ["en", "de", "fr", "en-GB", "en-US", "e", ""]
SCHEMA = {"group": "int64", "lang": "string", "score": "double", "key": "int64"}


def random_attributes(rng, key):
    attributes = {"key": key}
    if rng.random() > 0.1:
        attributes["group"] = int(rng.integers(0, 6))
    if rng.random() > 0.1:
        attributes["lang"] = LANGS[int(rng.integers(0, len(LANGS)))]
    if rng.random() > 0.1:
        attributes["score"] = int(rng.integers(0, 100)) / 100.0
    return attributes


def random_condition(rng):
    field = ["group", "lang", "score"][int(rng.integers(0, 3))]

    def value():
        if field == "group":
            return int(rng.integers(-1, 6))
        if field == "lang":
            return LANGS[int(rng.integers(0, len(LANGS)))]
        if rng.random() < 0.3:
            return int(rng.integers(0, 2))  # an int bound on the double field
        return int(rng.integers(0, 110)) / 100.0

    if field == "lang" and rng.random() < 0.3:
        return (field, "prefix", value())
    op = ["==", "!=", "<", "<=", ">", ">=", "in", "exists", "missing"][int(rng.integers(0, 9))]
    if op in ("exists", "missing"):
        return (field, op)
    if op == "in":
        return (field, "in", [value() for _ in range(int(rng.integers(1, 4)))])
    return (field, op, value())


def random_filter(rng, depth=1):
    """A filter in the client's forms: a list of conditions, with nested {"any_of": …} /
    {"none_of": …} items beside them, or a bare {"any_of": …} dict."""
    items = [random_condition(rng) for _ in range(int(rng.integers(0, 3)))]
    if depth < 4:
        if rng.random() < 0.5:
            items.append({"any_of": [random_filter(rng, depth + 1)
                                     for _ in range(int(rng.integers(1, 3)))]})
        if rng.random() < 0.3:
            items.append({"none_of": [random_filter(rng, depth + 1)]})
    if len(items) == 1 and isinstance(items[0], dict):
        return items[0]
    return items


def reference_condition(condition, attributes):
    field, op = condition[0], condition[1]
    if op == "missing":
        return field not in attributes
    if field not in attributes:
        return False
    if op == "exists":
        return True
    v, bound = attributes[field], condition[2]
    if op == "prefix":
        return v.startswith(bound)
    if op == "in":
        return any(v == b for b in bound)
    return {"==": v == bound, "!=": v != bound, "<": v < bound, "<=": v <= bound,
            ">": v > bound, ">=": v >= bound}[op]


def reference(filter_, attributes):
    """The definition (tessera.v1.Filter), spelled out over the client's forms."""
    if isinstance(filter_, dict):
        filter_ = [filter_]
    for item in filter_:
        if isinstance(item, dict):
            if "any_of" in item and not any(reference(f, attributes) for f in item["any_of"]):
                return False
            if "none_of" in item and any(reference(f, attributes) for f in item["none_of"]):
                return False
        elif not reference_condition(item, attributes):
            return False
    return True


def scroll_all(client, collection, filter_, limit):
    ids, after = [], None
    while True:
        page = client.scroll(collection, filter=filter_, after=after, limit=limit)
        ids += [d["id"] for d in page.documents]
        if page.next_after is None:
            return ids
        after = page.next_after


class FiltersTest(e2e_util.ServerTestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.rng = np.random.default_rng(34)
        cls.client = cls.server.client()
        cls.addClassCleanup(cls.client.close)
        cls.client.create_collection("docs", dim=DIM, attributes=SCHEMA, num_shards=3)
        cls.attributes = {}
        cls.tokens = {}
        docs = []
        for i in range(300):
            doc_id = f"d{i:04d}"
            cls.attributes[doc_id] = random_attributes(cls.rng, i)
            cls.tokens[doc_id] = e2e_util.normalized(cls.rng, int(cls.rng.integers(2, 12)), DIM)
            docs.append({"id": doc_id, "tokens": cls.tokens[doc_id],
                         "attributes": cls.attributes[doc_id]})
        assert all(r.ok for r in cls.client.upsert("docs", docs))

    def test_random_filters_equal_brute_force(self):
        probe = e2e_util.normalized(self.rng, 1, DIM)
        partial = 0
        for trial in range(150):
            filter_ = random_filter(self.rng)
            expected = sorted(i for i, a in self.attributes.items() if reference(filter_, a))
            partial += 0 < len(expected) < len(self.attributes)
            self.assertEqual(self.client.count("docs", filter=filter_), len(expected),
                             f"trial {trial}: {filter_}")
            self.assertEqual(scroll_all(self.client, "docs", filter_, 1 + trial % 40), expected,
                             f"trial {trial}: {filter_}")
            hits = self.client.search("docs", probe, k=1000, exhaustive=True, filter=filter_)
            self.assertEqual(sorted(hits.ids), expected, f"trial {trial}: {filter_}")
        self.assertGreater(partial, 50)

    def test_hit_attributes_equal_get(self):
        query = e2e_util.query_near(self.rng, self.tokens["d0007"], 4)
        for with_attributes in (True, ["lang"], ["group", "score"]):
            hits = self.client.search("docs", query, k=30, with_attributes=with_attributes)
            self.assertEqual(len(hits), 30)
            for hit in hits:
                stored = self.client.get("docs", hit.id)["attributes"]
                if with_attributes is not True:
                    stored = {k: v for k, v in stored.items() if k in with_attributes}
                self.assertEqual(hit.attributes, stored, hit.id)
        for hit in self.client.search("docs", query, k=5):
            self.assertEqual(hit.attributes, {})

    def test_groups_equal_brute_force_grouping(self):
        stored = {i: self.client.get("docs", i)["vectors"] for i in self.attributes}
        for q in range(4):
            query = e2e_util.query_near(self.rng, self.tokens[f"d{q * 17:04d}"], 5)
            exact = e2e_util.brute_force(query, stored)
            for field, group_size, groups in (("group", 3, 4), ("lang", 2, 10), ("key", 1, 5)):
                members = {}
                for doc_id, score in exact:
                    if field in self.attributes[doc_id]:
                        members.setdefault(self.attributes[doc_id][field], []).append(
                            (doc_id, score))
                ranked = sorted(members.items(), key=lambda kv: (-kv[1][0][1], kv[1][0][0]))
                ranked = [(value, hits[:group_size]) for value, hits in ranked[:groups]]
                result = self.client.search("docs", query, exhaustive=True, group_by=field,
                                            group_size=group_size, groups=groups,
                                            with_attributes=[field])
                self.assertEqual(len(result), 0)
                self.assertEqual([g.value for g in result.groups], [v for v, _ in ranked])
                for group, (value, want) in zip(result.groups, ranked):
                    self.assertEqual([h.id for h in group.hits], [i for i, _ in want])
                    for hit, (_, score) in zip(group.hits, want):
                        self.assertAlmostEqual(hit.score, score, delta=1e-4)
                        self.assertEqual(hit.attributes, {field: value})

    def test_bad_input_names_field_value_and_expectation(self):
        probe = e2e_util.normalized(self.rng, 1, DIM)
        deep = [("group", "exists")]
        for _ in range(8):
            deep = {"any_of": [deep]}
        cases = [
            (dict(group_by="colour"), "group_by: unknown field 'colour', expected one of the "
             "collection's attribute fields"),
            (dict(group_by="group", group_size=0), "group_size 0, expected 1 … 100"),
            (dict(group_by="group", groups=5000), "groups 5000, expected 1 … 1000 or 0 (k)"),
            (dict(with_attributes=["lang", "colour"]),
             "attribute_fields[1]: unknown field 'colour', expected one of the collection's "
             "attribute fields"),
            (dict(filter=deep), "filter.any_of[0].any_of[0].any_of[0].any_of[0].any_of[0]."
             "any_of[0].any_of[0].any_of[0]: nested 9 deep, expected at most 8"),
            (dict(filter=[{"none_of": [[("group", "prefix", "1")]]}]),
             "filter none_of[0] condition 0 on 'group': prefix on the int64 field, expected a "
             "string field"),
            (dict(filter=[("lang", "prefix", 3)]),
             "filter condition 0 on 'lang': a int64 value, but the field is string"),
        ]
        for options, message in cases:
            with self.assertRaises(tessera.TesseraError) as error:
                self.client.search("docs", probe, **options)
            self.assertCode(error, grpc.StatusCode.INVALID_ARGUMENT, message)
        with self.assertRaises(tessera.TesseraError) as error:
            self.client.delete("docs", filter=[])
        self.assertCode(error, grpc.StatusCode.INVALID_ARGUMENT, "filter: empty, expected at "
                        "least one condition")
        with self.assertRaises(tessera.TesseraError) as error:
            self.client.scroll("docs", limit=20000)
        self.assertCode(error, grpc.StatusCode.INVALID_ARGUMENT, "limit 20000, expected 1 … 10000")
        with self.assertRaises(tessera.TesseraError) as error:
            self.client.count("docs", filter=[("colour", "exists")])
        self.assertCode(error, grpc.StatusCode.INVALID_ARGUMENT,
                        "filter condition 0: unknown field 'colour'")
        self.assertEqual(self.client.count("docs"), len(self.attributes))


class DeleteByFilterCrashTest(e2e_util.ServerTestCase):
    """Deletes by filter on a thread, the server SIGKILLed in the middle: after the restart every
    delete acknowledged is there (its documents gone), nothing else is gone but what the one
    delete in flight may have taken."""

    def test_sigkill_during_deletes_by_filter(self):
        rng = np.random.default_rng(35)
        client = self.server.client()
        client.create_collection("crash", dim=DIM, attributes={"key": "int64"}, num_shards=2)
        documents = 3000
        docs = [{"id": f"k{i:05d}", "tokens": e2e_util.normalized(rng, 4, DIM),
                 "attributes": {"key": i}} for i in range(documents)]
        self.assertTrue(all(r.ok for r in client.upsert("crash", docs, batch_size=200)))
        # Each delete takes 5 keys by a nested filter: any_of [key in (…)], [key < -1]; none_of
        # [key missing].
        order = rng.permutation(documents)
        rounds = [sorted(int(k) for k in order[s:s + 5]) for s in range(0, documents, 5)]
        acknowledged, in_flight, failure = [], [], []
        enough = threading.Event()

        def delete():
            try:
                for keys in rounds:
                    in_flight[:] = [keys]
                    deleted = client.delete("crash", filter={
                        "any_of": [[("key", "in", keys)], [("key", "<", -1)]],
                        "none_of": [[("key", "missing")]]})
                    if deleted != 5:
                        failure.append(f"deleted {deleted} of {keys}")
                    acknowledged.append(keys)
                    if len(acknowledged) >= 60:
                        enough.set()
            except tessera.TesseraError as error:
                failure.append(error)
            finally:
                enough.set()

        thread = threading.Thread(target=delete)
        thread.start()
        self.assertTrue(enough.wait(120), "deletes too slow")
        self.server.kill()
        thread.join(60)
        self.assertFalse(thread.is_alive())
        client.close()
        self.assertTrue(failure and isinstance(failure[-1], tessera.TesseraError), failure)
        self.assertEqual(failure[-1].code, grpc.StatusCode.UNAVAILABLE)
        self.assertEqual(len(failure), 1, failure)
        self.assertLess(len(acknowledged), len(rounds), "killed too late to test anything")

        self.server.start()
        with self.server.client() as client:
            gone = {k for keys in acknowledged for k in keys}
            maybe = set(in_flight[0]) if in_flight and in_flight[0] not in acknowledged else set()
            present = {d["attributes"]["key"] for d in
                       client.scroll("crash", limit=10000, with_attributes=True).documents}
            self.assertFalse(gone & present, "an acknowledged delete by filter was lost")
            self.assertEqual(set(range(documents)) - gone - maybe, present - maybe)
            self.assertEqual(client.count("crash"), len(present))
            sys.stderr.write(f"killed after {len(acknowledged)} acknowledged deletes by filter "
                             f"({len(gone)} documents); {len(present)} left\n")


if __name__ == "__main__":
    e2e_util.main()
