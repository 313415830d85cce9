"""COCO box AP in NumPy: pycocotools' ``COCOeval`` (bbox) numbers, bit for bit, in a fraction of its time.

Why it exists: profiling a trial of the default study (512 synthetic val images at 96 px, 3 classes,
``studies/smoke.yaml``) showed ``COCOeval`` at 65 % of the evaluation time: ``evaluateImg`` (pure
Python per image x category x area range) 8.2 s, ``accumulate`` 1.6 s and ``loadRes`` 0.8 s per
evaluation. ``coco_box_stats`` computes the same 12 ``COCOeval.stats`` with whole-array NumPy code
and is checked against pycocotools with ``==`` on every stat (``tests/evaluation/test_fast_coco.py``:
random, tied, tiny, huge and crowd-overlapping detections, crowd ground truth, categories and
images without ground truth, detections outside ``img_ids``, SSD output).

What it replicates (pycocotools 2.0's ``cocoeval.py``, ``coco.py`` and ``maskApi.c``), for the
default bbox parameters only (``iouThrs`` .5:.05:.95, ``recThrs`` 0:.01:1, ``maxDets`` 1/10/100,
the four area ranges, ``useCats=1``):

* ``loadRes``: a detection's ``area`` is ``w*h`` of its box (computed as Python does it), ``iscrowd`` 0;
  detections on images the ground truth does not have are an error; ``evaluate`` then keeps only the
  images in ``img_ids`` and the categories of the ground truth (``cats``).
* ``computeIoU``/``bbIou``: in float64, ``w = fmin(dx+dw, gx+gw) - fmax(dx, gx)`` (0 when ``<= 0``),
  the same for ``h``, ``i = w*h``, union ``(da + ga) - i`` or ``da`` for a crowd gt, ``i/u``.
* ``evaluateImg``: per (image, category) the detections in stable (mergesort) order of ``-score``,
  the first 100; gt ``_ignore`` = crowd or area outside the range, ignored gt last (stable); greedy
  matching per IoU threshold ``min(t, 1-1e-10)``: the best not-yet-matched gt (a crowd gt may be
  matched again), ties to the later gt, a non-ignored gt before any ignored one; ``dtIgnore`` =
  the matched gt's ignore flag, or, for a detection without a match, its area outside the range;
  ``dtMatches`` holds gt ids (so a gt with id 0 counts as no match, as in ``accumulate``).
* ``accumulate``: per category/area/maxDet the image-order concatenation of each image's first
  ``maxDet`` detections, sorted by ``-score`` with a stable mergesort; ``tp``/``fp`` cumulative
  sums as float64; ``rc = tp/npig``, ``pr = tp/((fp+tp) + eps)``, the right-to-left maximum of
  ``pr``, read at ``searchsorted(rc, recThrs, 'left')`` (0 past the end); -1 where ``npig == 0``.
* ``summarize``: the same indexing and ``np.mean`` over the entries ``> -1`` (-1 if none).

How it is fast: matching walks the detection ranks (<= 100) once for all (image, category) groups
with the same number of gts at once, vectorised over area ranges, IoU thresholds and gts, and
visits only detections with an IoU >= 0.5 to some gt (the others can never match). ``accumulate``
needs the precision only at true positives (the envelope's maximum after a position is reached at
a true positive, and ``searchsorted`` on ``rc`` lands on one), so it works on the detections that
match something at some (area, threshold), plus one cumulative count per area range of the rest.
Every float that reaches a stat is computed by the same IEEE operations on the same operands as in
pycocotools. A group whose IoUs contain NaN (boxes with NaN/inf coordinates) is matched by a
line-by-line port of ``evaluateImg``'s loop, since NaN comparisons make the greedy rule irregular.

Why not a maintained library: faster-coco-eval 1.8.0 (a C++ ``COCOeval``) was tried in this module's place
(2026-11-27, 2 CPUs of an AMD EPYC, shared, load average 6-12), and it neither gives pycocotools' numbers nor
is faster than this module:

* equality: with its ``COCOeval_faster`` (bbox, ``params.imgIds`` set, ``loadRes`` on its own ``COCO`` of the
  same dataset) in place of :func:`coco_box_stats`, 23 of the 31 tests of
  ``tests/evaluation/test_fast_coco.py`` and ``test_coco_eval.py`` pass. Five differ from pycocotools in the
  last bit of a stat (at most 1.1e-16: its C++ sums in another order); the ground truth with id 0 gives AP
  0.2506 where pycocotools gives 0.2482 (it does not take a match to gt 0 for no match, as pycocotools'
  ``accumulate`` does); and NaN scores (a diverged run's detections) raise ``ValueError: Detection scores
  must not be NaN`` where pycocotools scores them.
* speed, the default study's val set (512 images, 76,410 detections, ``faster-coco-eval`` importable)::

      python benchmarks/coco_eval_speed.py --repeat 5

  the scoring alone, median of 5 interleaved repeats: pycocotools 4.44 s, faster-coco-eval 2.53 s, this
  module 0.30 s (faster-coco-eval 8.4x this module's time; its stats were pycocotools' bit for bit on
  this set). Its ``evaluate`` computes the IoUs with one Python call per (image, category).
"""

from __future__ import annotations

import numpy as np

#: COCOeval's default bbox parameters (``Params.setDetParams``), computed the same way
IOU_THRS = np.linspace(0.5, 0.95, int(np.round((0.95 - 0.5) / 0.05)) + 1, endpoint=True)
REC_THRS = np.linspace(0.0, 1.00, int(np.round((1.00 - 0.0) / 0.01)) + 1, endpoint=True)
MAX_DETS = [1, 10, 100]
AREA_RNG = [[0**2, 1e5**2], [0**2, 32**2], [32**2, 96**2], [96**2, 1e5**2]]
AREA_RNG_LBL = ["all", "small", "medium", "large"]

_T, _R, _A, _M = len(IOU_THRS), len(REC_THRS), len(AREA_RNG), len(MAX_DETS)
# evaluateImg's ``iou = min([t, 1-1e-10])``
_MATCH_THRS = np.array([min([t, 1 - 1e-10]) for t in IOU_THRS], dtype=np.float64)
_MIN_MATCH = float(_MATCH_THRS.min())


def _outside(area: np.ndarray) -> np.ndarray:
    """``area < lo or area > hi`` for each area range: shape ``(len(area), A)``."""
    lo = np.array([r[0] for r in AREA_RNG], dtype=np.float64)
    hi = np.array([r[1] for r in AREA_RNG], dtype=np.float64)
    return (area[:, None] < lo[None, :]) | (area[:, None] > hi[None, :])


def _box_iou(d: np.ndarray, g: np.ndarray, crowd: np.ndarray) -> np.ndarray:
    """maskApi.c's ``bbIou`` elementwise on broadcast [x, y, w, h] arrays ``d`` and ``g`` (last axis 4)."""
    dx, dy, dw, dh = d[..., 0], d[..., 1], d[..., 2], d[..., 3]
    gx, gy, gw, gh = g[..., 0], g[..., 1], g[..., 2], g[..., 3]
    with np.errstate(all="ignore"):
        da = dw * dh
        ga = gw * gh
        w = np.fmin(dw + dx, gw + gx) - np.fmax(dx, gx)
        h = np.fmin(dh + dy, gh + gy) - np.fmax(dy, gy)
        i = w * h
        u = np.where(crowd, da, (da + ga) - i)
        return np.where((w <= 0) | (h <= 0), 0.0, i / u)


def _match_exact(iou: np.ndarray, gt_ig: np.ndarray, crowd: np.ndarray, gid: np.ndarray):
    """evaluateImg's matching loop, line by line, for one (image, category): the NaN-safe fallback.

    ``iou`` (D, G) in detection rank order and gt input order, ``gt_ig`` (A, G), ``crowd`` (G,),
    ``gid`` (G,). Returns ``(matched, nonzero_id, gt_ignored)``, each (D, A, T) bool.
    """
    D, G = iou.shape
    matched = np.zeros((D, _A, _T), bool)
    nonzero = np.zeros((D, _A, _T), bool)
    ignored = np.zeros((D, _A, _T), bool)
    for a in range(_A):
        gtind = np.argsort(gt_ig[a].astype(np.int64), kind="mergesort")
        ig = gt_ig[a][gtind].tolist()
        cr = crowd[gtind].tolist()
        ious = iou[:, gtind].tolist()
        for tind, t in enumerate(IOU_THRS):
            gtm = [False] * G
            for dind in range(D):
                best = min([t, 1 - 1e-10])
                m = -1
                for gind in range(G):
                    if gtm[gind] and not cr[gind]:
                        continue
                    if m > -1 and not ig[m] and ig[gind]:
                        break
                    if ious[dind][gind] < best:
                        continue
                    best = ious[dind][gind]
                    m = gind
                if m == -1:
                    continue
                matched[dind, a, tind] = True
                nonzero[dind, a, tind] = gid[gtind[m]] != 0
                ignored[dind, a, tind] = bool(ig[m])
                gtm[m] = True
    return matched, nonzero, ignored


def _match_bucket(iou, rank, row, gt_ig, crowd, gid, out_matched, out_nonzero, out_ignored, det_idx):
    """Greedy matching of every group with the same number of gts ``G`` at once.

    ``iou`` (nd, G), ``rank`` (nd,) the detection's rank in its group, ``row`` (nd,) its group's row
    in ``gt_ig`` (n, A, G) / ``crowd`` (n, G) / ``gid`` (n, G). Results go to ``out_*[det_idx]``.
    No IoU may be NaN here.
    """
    n, _, G = gt_ig.shape
    taken = np.zeros((n, _A, _T, G), bool)  # gtm > 0
    thr = _MATCH_THRS[None, None, :, None]
    active = np.flatnonzero((iou >= _MIN_MATCH).any(axis=1))
    if active.size == 0:
        return
    active = active[np.argsort(rank[active], kind="stable")]
    bounds = np.searchsorted(rank[active], np.arange(rank[active][-1] + 2), side="left")
    for d in range(len(bounds) - 1):
        j = active[bounds[d] : bounds[d + 1]]  # detections of rank d: one per group at most
        if j.size == 0:
            continue
        r = row[j]
        io = iou[j][:, None, None, :]  # (k, 1, 1, G)
        ig = gt_ig[r][:, :, None, :]  # (k, A, 1, G)
        avail = ~taken[r] | crowd[r][:, None, None, :]  # (k, A, T, G)
        cand = avail & (io >= thr)
        cand_ni = cand & ~ig
        has_ni = cand_ni.any(axis=-1, keepdims=True)
        use = np.where(has_ni, cand_ni, cand & ig)  # a non-ignored match first, else an ignored one
        val = np.where(use, io, -np.inf)
        best = val.max(axis=-1, keepdims=True)
        last = use & (val == best)  # ties: the later gt wins (``<`` continue)
        m = G - 1 - np.argmax(last[..., ::-1], axis=-1)  # (k, A, T)
        hit = use.any(axis=-1)  # (k, A, T)
        kk, aa, tt = np.nonzero(hit)
        mm = m[kk, aa, tt]
        taken[r[kk], aa, tt, mm] = True
        out = det_idx[j]
        out_matched[out] = hit
        nz = np.zeros(hit.shape, bool)
        nz[kk, aa, tt] = gid[r[kk], mm] != 0
        out_nonzero[out] = nz
        gi = np.zeros(hit.shape, bool)
        gi[kk, aa, tt] = gt_ig[r[kk], aa, mm]
        out_ignored[out] = gi


def _summarize(precision, recall, ap=1, iouThr=None, areaRng="all", maxDets=100):
    """COCOeval.summarize's ``_summarize``, the same indexing and mean."""
    aind = [i for i, aRng in enumerate(AREA_RNG_LBL) if aRng == areaRng]
    mind = [i for i, mDet in enumerate(MAX_DETS) if mDet == maxDets]
    if ap == 1:
        s = precision
        if iouThr is not None:
            t = np.where(iouThr == IOU_THRS)[0]
            s = s[t]
        s = s[:, :, :, aind, mind]
    else:
        s = recall
        if iouThr is not None:
            t = np.where(iouThr == IOU_THRS)[0]
            s = s[t]
        s = s[:, :, aind, mind]
    if len(s[s > -1]) == 0:
        return -1
    return np.mean(s[s > -1])


def _summarize_dets(precision, recall) -> np.ndarray:
    stats = np.zeros((12,))
    stats[0] = _summarize(precision, recall, 1)
    stats[1] = _summarize(precision, recall, 1, iouThr=0.5, maxDets=MAX_DETS[2])
    stats[2] = _summarize(precision, recall, 1, iouThr=0.75, maxDets=MAX_DETS[2])
    stats[3] = _summarize(precision, recall, 1, areaRng="small", maxDets=MAX_DETS[2])
    stats[4] = _summarize(precision, recall, 1, areaRng="medium", maxDets=MAX_DETS[2])
    stats[5] = _summarize(precision, recall, 1, areaRng="large", maxDets=MAX_DETS[2])
    stats[6] = _summarize(precision, recall, 0, maxDets=MAX_DETS[0])
    stats[7] = _summarize(precision, recall, 0, maxDets=MAX_DETS[1])
    stats[8] = _summarize(precision, recall, 0, maxDets=MAX_DETS[2])
    stats[9] = _summarize(precision, recall, 0, areaRng="small", maxDets=MAX_DETS[2])
    stats[10] = _summarize(precision, recall, 0, areaRng="medium", maxDets=MAX_DETS[2])
    stats[11] = _summarize(precision, recall, 0, areaRng="large", maxDets=MAX_DETS[2])
    return stats


def coco_box_eval(gt, detections: list[dict], img_ids=None) -> tuple[np.ndarray, np.ndarray]:
    """``(precision [T,R,K,A,M], recall [T,K,A,M])``, equal to ``COCOeval.eval``'s after ``accumulate``.

    Arguments as for :func:`coco_box_stats`.
    """
    ids = np.unique(np.asarray(sorted(gt.imgs) if img_ids is None else list(img_ids)))
    cats = np.unique(np.asarray(sorted(gt.cats)))
    img_pos = {i: n for n, i in enumerate(ids.tolist())}
    cat_pos = {c: n for n, c in enumerate(cats.tolist())}
    nI, K = len(ids), len(cats)
    precision = -np.ones((_T, _R, K, _A, _M))
    recall = -np.ones((_T, K, _A, _M))
    if nI == 0 or K == 0:
        return precision, recall
    g = _ground_truth(gt, img_pos, cat_pos, nI, K)
    d = _detections(gt, detections, img_pos, cat_pos, nI)
    m = _match(g, d)
    _accumulate(g, d, m, K, nI, precision, recall)
    return precision, recall


def _ground_truth(gt, img_pos: dict, cat_pos: dict, nI: int, K: int) -> dict:
    """Ground truth of the evaluated images and categories, grouped by (category, image), input order
    kept: boxes, crowd flags, ids, which area ranges ignore each, and the not-ignored count per
    (category, area range)."""
    gts = [a for a in gt.anns.values() if a["image_id"] in img_pos and a["category_id"] in cat_pos]
    g_key = np.array([cat_pos[a["category_id"]] * nI + img_pos[a["image_id"]] for a in gts], dtype=np.int64)
    order = np.argsort(g_key, kind="stable")
    gts = [gts[i] for i in order]
    g_key = g_key[order]
    g_box = np.array([a["bbox"] for a in gts], dtype=np.float64).reshape(-1, 4)
    g_area = np.array([a["area"] for a in gts], dtype=np.float64)
    g_crowd = np.array([int(a.get("iscrowd", 0)) != 0 for a in gts], dtype=bool)
    g_flag = np.array([bool("iscrowd" in a and a["iscrowd"]) for a in gts], dtype=bool)  # gt['ignore']
    g_id = np.array([a["id"] for a in gts])
    g_ig = g_flag[:, None] | _outside(g_area)  # (Ngt, A): _ignore
    npig = np.zeros((K, _A), dtype=np.int64)
    np.add.at(npig, g_key // nI, ~g_ig)
    n_groups = K * nI
    g_start = np.searchsorted(g_key, np.arange(n_groups), side="left")
    g_count = np.searchsorted(g_key, np.arange(n_groups), side="right") - g_start
    return {"box": g_box, "crowd": g_crowd, "id": g_id, "ig": g_ig, "npig": npig, "start": g_start, "count": g_count}


def _detections(gt, detections: list[dict], img_pos: dict, cat_pos: dict, nI: int) -> dict:
    """The detections (loadRes + the imgIds/catIds filter), per group in stable -score order, the
    first 100 of each: their group key, box, area, -score and rank within the group."""
    img_get, cat_get = img_pos.get, cat_pos.get
    # one pass: image and category position (-1: not evaluated), -score (the key COCOeval sorts on),
    # the box and loadRes' area ``bb[2]*bb[3]`` (a Python product, as loadRes computes it)
    rec = [
        (img_get(d["image_id"], -1), cat_get(d["category_id"], -1), -d["score"], *b, b[2] * b[3])
        for d in detections
        for b in (d["bbox"],)
    ]
    table = np.array(rec, dtype=np.float64).reshape(-1, 8)
    skipped = table[:, 0] < 0
    suspect = skipped if img_pos.keys() <= gt.imgs.keys() else np.ones(len(table), bool)
    if suspect.any():  # loadRes asserts that every detection's image is in the ground truth
        unknown = {d["image_id"] for d, s in zip(detections, suspect.tolist()) if s} - set(gt.imgs)
        if unknown:
            raise ValueError(
                f"Results do not correspond to current coco set: image ids {sorted(unknown)[:5]} "
                "are not in the ground truth"
            )
    table = table[~skipped & (table[:, 1] >= 0)]
    d_key = table[:, 1].astype(np.int64) * nI + table[:, 0].astype(np.int64)
    d_score, d_box, d_area = table[:, 2], table[:, 3:7], table[:, 7]
    order = np.argsort(d_score, kind="mergesort")
    order = order[np.argsort(d_key[order], kind="stable")]
    d_key, d_box, d_area, d_score = d_key[order], d_box[order], d_area[order], d_score[order]
    nd = len(d_key)
    first = np.searchsorted(d_key, d_key, side="left")
    rank = np.arange(nd) - first
    keep = rank < MAX_DETS[-1]
    return {"key": d_key[keep], "box": d_box[keep], "area": d_area[keep], "score": d_score[keep], "rank": rank[keep]}


def _match(g: dict, d: dict) -> dict:
    """evaluateImg: matching per (image, category), all area ranges and IoU thresholds at once; what
    the accumulation reads of it (the detections matched somewhere, their true-positive and
    not-ignored flags, and the unmatched ones that count as false positives per area range)."""
    d_key, rank = d["key"], d["rank"]
    nd = len(d_key)
    matched = np.zeros((nd, _A, _T), bool)
    nonzero = np.zeros((nd, _A, _T), bool)  # dtMatches != 0
    gt_ignored = np.zeros((nd, _A, _T), bool)  # gtIg[m] of the match
    G_of = g["count"][d_key] if nd else np.zeros(0, np.int64)
    for G in np.unique(G_of[G_of > 0]).tolist():
        det_idx = np.flatnonzero(G_of == G)
        groups, row = np.unique(d_key[det_idx], return_inverse=True)
        gi = g["start"][groups][:, None] + np.arange(G)[None, :]  # (n, G) gt indices
        iou = _box_iou(d["box"][det_idx][:, None, :], g["box"][gi[row]], g["crowd"][gi[row]])
        bad = np.zeros(len(groups), bool)
        bad[row[np.isnan(iou).any(axis=1)]] = True
        for b in np.flatnonzero(bad).tolist():
            sel = np.flatnonzero(row == b)  # rank order
            res = _match_exact(iou[sel], g["ig"][gi[b]].T, g["crowd"][gi[b]], g["id"][gi[b]])
            matched[det_idx[sel]], nonzero[det_idx[sel]], gt_ignored[det_idx[sel]] = res
        ok = ~bad[row]
        _match_bucket(
            iou[ok],
            rank[det_idx[ok]],
            row[ok],
            g["ig"][gi].transpose(0, 2, 1),
            g["crowd"][gi],
            g["id"][gi],
            matched,
            nonzero,
            gt_ignored,
            det_idx[ok],
        )
    d_out = _outside(d["area"])  # (nd, A)
    touched = matched.any(axis=(1, 2))  # detections matched at some (area range, threshold)
    t_idx = np.flatnonzero(touched)
    t_row = np.full(nd, -1, np.int64)
    t_row[t_idx] = np.arange(len(t_idx))
    t_ig = gt_ignored[t_idx] | (~nonzero[t_idx] & d_out[t_idx][:, :, None])  # dtIgnore (nS, A, T)
    return {
        "touched": touched,
        "row": t_row,
        "tp": (nonzero[t_idx] & ~t_ig).transpose(1, 2, 0),  # (A, T, nS)
        "ni": (~t_ig).transpose(1, 2, 0),
        "free": ~touched[:, None] & ~d_out,
    }  # (nd, A): fp where not ignored


def _accumulate(g: dict, d: dict, m: dict, K: int, nI: int, precision: np.ndarray, recall: np.ndarray) -> None:
    """accumulate: ``precision`` and ``recall`` filled in place, per category, max detections, area
    range and IoU threshold."""
    d_key, d_score, rank, npig = d["key"], d["score"], d["rank"], g["npig"]
    touched, t_row, t_tp, t_ni, free_in = m["touched"], m["row"], m["tp"], m["ni"], m["free"]
    eps = np.spacing(1)
    cat_bounds = np.searchsorted(d_key, np.arange(K + 1) * nI, side="left")
    for k in range(K):
        if not npig[k].any():
            continue
        lo, hi = cat_bounds[k], cat_bounds[k + 1]
        srt = np.argsort(d_score[lo:hi], kind="mergesort") + lo  # image order, rank order, then -score
        for mi, max_det in enumerate(MAX_DETS):
            sel = srt[rank[srt] < max_det]
            n = len(sel)
            cum_free = np.cumsum(free_in[sel].T, axis=1)  # (A, n)
            pos = np.flatnonzero(touched[sel])
            s_rows = t_row[sel[pos]]
            nS = len(pos)
            tp = t_tp[:, :, s_rows]
            cum_tp = np.cumsum(tp, axis=-1)
            cum_ni = np.cumsum(t_ni[:, :, s_rows], axis=-1) + cum_free[:, pos][:, None, :]  # fp + tp
            with np.errstate(all="ignore"):
                pr = np.where(tp, cum_tp / (cum_ni.astype(np.float64) + eps), 0.0)
            env = np.maximum.accumulate(pr[..., ::-1], axis=-1)[..., ::-1]
            for a in range(_A):
                npg = int(npig[k, a])
                if npg == 0:
                    continue
                # the first tp count whose recall reaches each threshold: searchsorted(rc, recThrs) lands there
                need = np.searchsorted(np.arange(npg + 1) / npg, REC_THRS, side="left")
                for t in range(_T):
                    recall[t, k, a, mi] = (cum_tp[a, t, -1] if nS else 0) / npg if n else 0
                    if nS == 0:
                        precision[t, :, k, a, mi] = 0.0
                        continue
                    at = np.searchsorted(cum_tp[a, t], need, side="left")
                    precision[t, :, k, a, mi] = np.where(at < nS, env[a, t, np.minimum(at, nS - 1)], 0.0)


def coco_box_stats(gt, detections: list[dict], img_ids=None) -> np.ndarray:
    """The 12 ``COCOeval(gt, gt.loadRes(detections), "bbox").stats`` with ``params.imgIds = img_ids``.

    ``gt``: a pycocotools ``COCO`` (only its ``imgs``, ``anns`` and ``cats`` are read; ``gt`` is not
    modified). ``detections``: result dicts (``image_id``, ``category_id``, ``bbox`` [x, y, w, h],
    ``score``), any number per image and category, in any order (the input order breaks score ties, as
    in pycocotools); those of other images than ``img_ids`` or of categories not in ``gt.cats`` are
    left out, as COCOeval does. ``img_ids``: the images evaluated (default: all of ``gt``).
    Returns float64 [12]: AP, AP50, AP75, AP small/medium/large, AR1, AR10, AR100, AR small/medium/
    large; -1 where pycocotools gives -1 (no ground truth to average over). Raises ``ValueError`` for
    detections on images ``gt`` does not have (``loadRes`` asserts this).
    """
    precision, recall = coco_box_eval(gt, detections, img_ids)
    return _summarize_dets(precision, recall)
