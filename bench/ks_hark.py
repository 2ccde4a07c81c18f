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

t = time.time()
agent = KrusellSmithType()
economy = KrusellSmithEconomy(agents=[agent])
economy.give_agent_params()
economy.make_Mrkv_history()
economy.verbose = True
economy.solve()
secs = time.time() - t
hist = economy.history
A = np.asarray(hist["Aprev"])
M = np.asarray(hist["Mnow"])
mrkv = np.asarray(hist["Mrkv"])
disc = economy.T_discard
# K_t = Aprev_t; regress ln K_{t+1} on ln K_t by state of t, as ks_solve does
K = A
x, y, s = np.log(K[disc:-1]), np.log(K[disc + 1:]), mrkv[disc:-1]
rows = {}
for st in (0, 1):
    m = s == st
    b1, b0 = np.polyfit(x[m], y[m], 1)
    rows[st] = [b0, b1]
out = {"seconds": secs, "AFunc_intercept": list(map(float, economy.intercept_prev)),
       "AFunc_slope": list(map(float, economy.slope_prev)),
       "K_on_K": {"bad": rows[0], "good": rows[1]}, "mean_K": float(K[disc:].mean()),
       "mean_M": float(M[disc:].mean()), "LbrInd": economy.LbrInd, "act_T": economy.act_T, "T_discard": disc,
       "AgentCount": agent.AgentCount, "Mgrid": list(map(float, agent.Mgrid)), "aGrid_max": float(agent.aGrid.max())}
print(json.dumps(out))
with open(sys.argv[1] if len(sys.argv) > 1 else "hark_result.json", "w") as handle:
    json.dump(out, handle)
