"""Retrieval quality of a run against relevance judgements, computed by pytrec_eval (trec_eval's
own code), and the overlap of a run with an exact ranking."""

from typing import Dict

import numpy as np
import pytrec_eval


def evaluate(qrels: Dict[str, Dict[str, int]], run: Dict[str, Dict[str, float]]) -> Dict:
    """Mean nDCG@10 and recall@100 over every judged query; a judged query missing from the run
    counts as 0 (trec_eval -c)."""
    evaluator = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10", "recall.100"})
    per_query = evaluator.evaluate(run)
    return {"ndcg@10": sum(per_query.get(q, {}).get("ndcg_cut_10", 0.0) for q in qrels)
            / len(qrels),
            "recall@100": sum(per_query.get(q, {}).get("recall_100", 0.0) for q in qrels)
            / len(qrels),
            "evaluated_queries": len(per_query)}


def recall_vs_exact(run, exact_run, k: int = 10) -> float:
    """Mean fraction of the exact top-k that a run's top-k holds (ties broken by id)."""
    def top(ranking):
        return set(sorted(ranking, key=lambda d: (-ranking[d], d))[:k])
    return float(np.mean([len(top(run.get(q, {})) & top(exact_run[q])) / min(k, len(exact_run[q]))
                          for q in exact_run if exact_run[q]]))
