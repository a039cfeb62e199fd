# Build and run the csrc/kernels tests and benchmark, independently of
# tests/c/Makefile (the store tests).  Works from any directory:
#
#   make -f tests/c/kernels.mk            build and run test_kernels, twice:
#                                         as shipped, and with only the
#                                         portable casts (-DPD_KERNELS_PORTABLE)
#   make -f tests/c/kernels.mk SAN=1      the same under ASan + UBSan
#   make -f tests/c/kernels.mk bench      print kernel GB/s next to memcpy
#   make -f tests/c/kernels.mk vecreport  which kernel loops vectorised
#   make -f tests/c/kernels.mk clean
#
# QUICK=1 skips the exhaustive 2^32 float16 sweep (PD_TEST_QUICK=1).

HERE := $(patsubst %/,%,$(dir $(lastword $(MAKEFILE_LIST))))
ROOT := $(HERE)/../..

CC ?= cc
CFLAGS := -std=c11 -O3 -Wall -Wextra -D_GNU_SOURCE -I$(ROOT)/csrc $(EXTRA_CFLAGS)
LDLIBS := -lm

# Sanitised objects live apart from plain ones so the two never mix.
ifeq ($(SAN),1)
CFLAGS += -fsanitize=address,undefined -fno-sanitize-recover=all \
          -fno-omit-frame-pointer -g
LDFLAGS += -fsanitize=address,undefined
BUILD := $(HERE)/build/kernels-san
else
BUILD := $(HERE)/build/kernels
endif

ifeq ($(QUICK),1)
RUNENV := PD_TEST_QUICK=1
endif

LIB_SRCS := $(wildcard $(ROOT)/csrc/kernels/*.c) $(ROOT)/csrc/util/status.c
LIB_HDRS := $(wildcard $(ROOT)/csrc/kernels/*.h) $(ROOT)/csrc/util/status.h
LIB_OBJS := $(patsubst $(ROOT)/csrc/%.c,$(BUILD)/%.o,$(LIB_SRCS))
PORT_OBJS := $(patsubst $(ROOT)/csrc/%.c,$(BUILD)/portable/%.o,$(LIB_SRCS))
PORTABLE := -DPD_KERNELS_PORTABLE

.PHONY: all test test-default test-portable bench vecreport clean

all: test

$(BUILD)/portable/%.o: $(ROOT)/csrc/%.c $(LIB_HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(PORTABLE) -c $< -o $@

$(BUILD)/%.o: $(ROOT)/csrc/%.c $(LIB_HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/test_kernels: $(HERE)/test_kernels.c $(LIB_OBJS) $(LIB_HDRS)
	$(CC) $(CFLAGS) $(LDFLAGS) $< $(LIB_OBJS) -o $@ $(LDLIBS)

$(BUILD)/portable/test_kernels: $(HERE)/test_kernels.c $(PORT_OBJS) $(LIB_HDRS)
	$(CC) $(CFLAGS) $(PORTABLE) $(LDFLAGS) $< $(PORT_OBJS) -o $@ $(LDLIBS)

$(BUILD)/bench_kernels: $(HERE)/bench_kernels.c $(LIB_OBJS) $(LIB_HDRS)
	$(CC) $(CFLAGS) $(LDFLAGS) $< $(LIB_OBJS) -o $@ $(LDLIBS)

test: test-default test-portable

test-default: $(BUILD)/test_kernels
	$(RUNENV) $(BUILD)/test_kernels

test-portable: $(BUILD)/portable/test_kernels
	$(RUNENV) $(BUILD)/portable/test_kernels

bench: $(BUILD)/bench_kernels
	$(BUILD)/bench_kernels $(BENCH_MIB)

# The compiler's own account of which loops it vectorised.
vecreport:
	@for f in $(ROOT)/csrc/kernels/*.c; do \
	    $(CC) $(CFLAGS) -fopt-info-vec-optimized -c $$f -o /dev/null; \
	done 2>&1 | sort | uniq -c

clean:
	rm -rf $(HERE)/build/kernels $(HERE)/build/kernels-san
