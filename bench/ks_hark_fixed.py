"""HARK's KrusellSmithEconomy with one fix: the agent rebuilds its transition arrays from the current AFunc
before every solve (econ-ark 0.17.2 builds them once, in give_agent_params, from the initial AFunc
intercept 0 / slope 1, i.e. the belief A_t = M_t, and Market.update_dynamics only setattr's AFunc), and an
asset grid reaching AMAX (HARK's default top of 50 lets a few agents' wealth explode). See bench/RESULTS.md
(issue 12) for the side by side with ``ks_solve``'s ``ks1998`` preset. Needs econ-ark (a separate venv).

    /tmp/hark/bin/python bench/ks_hark_fixed.py OUT.json ACT_T T_DISCARD C0 C1 DAMPING MAX_LOOPS AMAX ACOUNT
    /tmp/hark/bin/python bench/ks_hark_fixed.py hark_fixed.json 5000 500 -0.1316 1.0244 0.5 8 1000 80

(C0, C1: the starting AFunc ln A = C0 + C1 ln M for both states; DAMPING: HARK's DampingFac.)
"""
import json
import sys
import time

import numpy as np
from HARK.ConsumptionSaving.ConsAggShockModel import KrusellSmithEconomy, KrusellSmithType
from ks_hark import alm_summary  # the script's folder is on sys.path

ARRAYS = ("transition_arrays", "ProbArray", "mNextArray", "MnextArray", "RnextArray")


class FixedKrusellSmithType(KrusellSmithType):
    def pre_solve(self):
        self.construct(*ARRAYS)  # reads self.AFunc, the rule update_dynamics just set
        super().pre_solve()
        print("solving with AFunc", [(round(f.intercept, 5), round(f.slope, 5)) for f in self.AFunc], flush=True)


class LoggingKrusellSmithEconomy(KrusellSmithEconomy):
    def calc_AFunc(self, Mnow, Aprev):
        A = np.asarray(Aprev)[self.T_discard:]
        print(f"loop: mean K {A.mean():.4f} (min {A.min():.3f}, max {A.max():.3f}), "
              f"max individual a {np.max(self.agents[0].state_now['aNow']):.2f}", flush=True)
        return super().calc_AFunc(Mnow, Aprev)


act_T, discard = int(sys.argv[2]), int(sys.argv[3])
c0, c1 = float(sys.argv[4]), float(sys.argv[5])
t = time.time()
agent = FixedKrusellSmithType(aMax=float(sys.argv[8]), aCount=int(sys.argv[9]))
economy = LoggingKrusellSmithEconomy(agents=[agent], act_T=act_T, T_discard=discard, DampingFac=float(sys.argv[6]),
                              intercept_prev=[c0, c0], slope_prev=[c1, c1])
economy.give_agent_params()
economy.make_Mrkv_history()
economy.verbose = True
economy.max_loops = int(sys.argv[7])
economy.solve()
out = {"seconds": time.time() - t, **alm_summary(economy, discard), "act_T": act_T, "T_discard": discard,
       "AgentCount": agent.AgentCount, "max_a": float(np.max(agent.state_now["aNow"]))}
print(json.dumps(out))
with open(sys.argv[1], "w") as handle:
    json.dump(out, handle)
