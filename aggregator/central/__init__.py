"""Central differential privacy over consolidated data (output perturbation).

* `noise`: exact discrete Laplace / discrete Gaussian samplers (Canonne, Kamath,
  Steinke 2020) on integers, the defence against floating-point attacks;
* `calibration`: noise scales from (ε, δ, sensitivity): Laplace, the classic
  Gaussian bound and the analytic Gaussian (Balle and Wang 2018);
* `releases`: private count, sum, mean and the exponential mechanism, each
  reserving its (ε, δ) in the ledger before reading the data;
* `accounting`: composition per (subject, purpose) from the ledger alone:
  basic always, RDP or PLD (Google's dp-accounting) as options.
"""
