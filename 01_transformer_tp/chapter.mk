# Chapter 01 links chapter 00's tensor-parallel building blocks (f, g, column/row-parallel linears).
LINKS_01 := 00_naive_tp_mlp/tensor_parallel.c
