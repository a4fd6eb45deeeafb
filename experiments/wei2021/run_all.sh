#!/usr/bin/env bash
# Regenerates every figure of the Wei et al. reproduction (from the repository root).
# Wall times on the 2-core CPU are in REPRODUCTION.md. Seeds are reduced where
# marked to fit a 2-core CPU; the committed results come from exactly these commands.
set -euo pipefail
cd "$(dirname "$0")/../.."
W=experiments/wei2021
python $W/calibrate.py                                             # eps = inf calibration, paper regime
python $W/fig2_moment_bound.py
python $W/compare_methods.py --q 1                                 # Figs. 5, 8a, 9a, 10a (3 seeds, the default)
python $W/compare_methods.py --q 1 --regime strong --seeds 3       # same, |D_i| = 25
python $W/fig4_svm_loss_vs_T.py --seeds 3
python $W/theory_tstar.py                                          # after Figs. 4 and 5
python $W/fig12_13_noniid_unbalanced.py --setting noniid --seeds 3
python $W/fig12_13_noniid_unbalanced.py --setting unbalanced --seeds 3
python $W/fig14_15_beta.py --seeds 3 --epsilons 4,12
python $W/compare_methods.py --q 0.6 --seeds 3                     # Figs. 6, 8b, 9b, 10b
python $W/compare_methods.py --q 1 --regime paper --seeds 1 --epsilons 4,20 --t-grid 50,100,200,300
python $W/compare_methods.py --q 1 --regime paper --lr 2 --clip 5.525 --seeds 3 --epsilons 4,8,12,16,20 --t-grid 50,100,200 --tag _cal   # calibrated eta, C (3-point T grid)
python $W/compare_methods.py --q 1 --regime paper --lr 2 --clip 5.525 --seeds 3 --tag _cal_full   # calibrated eta, C (full T grid)
python $W/compare_methods.py --q 0.6 --regime paper --lr 2 --clip 5.525 --seeds 3 --tag _cal_full   # calibrated eta, C, K/U = 0.6 (Fig. 6)
python $W/fig7_initial_T.py --seeds 3
python $W/fig11_cifar.py                                           # skipped without CIFAR-10
