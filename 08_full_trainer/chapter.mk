# The --plan calculator (plan_calculator.c) also calls chapter 03's activation formulas, which live
# in its report file.
LINKS_08 += 03_sequence_parallel/sp_report.c
