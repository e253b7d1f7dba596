# chapter_folder.mk: included by the Makefile in each chapter's folder, so that make run | check |
# plot | bench | assignment work from inside it; the root Makefile does the work, with the same
# variables (NP=4, ARGS="...", BACKEND=...). The chapter number comes from the folder's name.
NN := $(firstword $(subst _, ,$(notdir $(CURDIR))))
.PHONY: all run check plot bench assignment
all run:
	@$(MAKE) --no-print-directory -C .. run-$(NN)
check plot bench assignment:
	@$(MAKE) --no-print-directory -C .. $@-$(NN)
