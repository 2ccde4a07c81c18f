"""HARK's Krusell-Smith example with its default parameters: its ALM and mean capital, for the side-by-side table
of bench/ks_calibrations.py (``--hark FILE``). Needs econ-ark (not a project dependency: a separate venv,
``python3 -m venv /tmp/hark && /tmp/hark/bin/pip install econ-ark``); about 20 minutes on two CPU cores.

    /tmp/hark/bin/python bench/ks_hark.py hark_result.json
"""
import json
import sys
import time

import numpy as np
from HARK.ConsumptionSaving.ConsAggShockModel import KrusellSmithEconomy, KrusellSmithType


def alm_summary(economy: KrusellSmithEconomy, discard: int) -> dict:
    """HARK's solved economy in ks_solve's terms: K_t = Aprev_t, ln K_{t+1} on ln K_t by the state of t (as
    ks_solve regresses), the means of K and M after ``discard`` periods, and HARK's own AFunc."""
    hist = economy.history
    K, M, mrkv = (np.asarray(hist[name]) for name in ("Aprev", "Mnow", "Mrkv"))
    x, y, s = np.log(K[discard:-1]), np.log(K[discard + 1:]), mrkv[discard:-1]
    rows = {}
    for st in (0, 1):
        b1, b0 = np.polyfit(x[s == st], y[s == st], 1)
        rows[st] = [float(b0), float(b1)]
    return {"AFunc_intercept": list(map(float, economy.intercept_prev)),
            "AFunc_slope": list(map(float, economy.slope_prev)), "K_on_K": {"bad": rows[0], "good": rows[1]},
            "mean_K": float(K[discard:].mean()), "mean_M": float(M[discard:].mean())}


if __name__ == "__main__":
    t = time.time()
    agent = KrusellSmithType()
    economy = KrusellSmithEconomy(agents=[agent])
    economy.give_agent_params()
    economy.make_Mrkv_history()
    economy.verbose = True
    economy.solve()
    out = {"seconds": time.time() - t, **alm_summary(economy, economy.T_discard), "LbrInd": economy.LbrInd,
           "act_T": economy.act_T, "T_discard": economy.T_discard, "AgentCount": agent.AgentCount,
           "Mgrid": list(map(float, agent.Mgrid)), "aGrid_max": float(agent.aGrid.max())}
    print(json.dumps(out))
    with open(sys.argv[1] if len(sys.argv) > 1 else "hark_result.json", "w") as handle:
        json.dump(out, handle)
