# Thin wrapper over CMake so that plain `make` works.
#   make          build build/deepinfer, libdeepinfer.{a,so} and the tests
#   make test     install missing system packages, build with -Werror, run every test
#   make demo     install missing system packages, build, and generate text with the default model
#   make fuzz     build the libFuzzer targets into build-fuzz/ (clang)
#   make install  install into PREFIX (default /usr/local)
BUILD   ?= build
PREFIX  ?= /usr/local
JOBS    ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_FLAGS ?=

.PHONY: all deps test demo fuzz install clean format

all: $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=$(PREFIX) $(CMAKE_FLAGS)

deps:
	@bash tools/install_deps.sh

test: deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DDI_WERROR=ON $(CMAKE_FLAGS)
	cmake --build $(BUILD) -j $(JOBS)
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

demo: deps all
	bash tools/demo.sh $(BUILD)/deepinfer

fuzz: deps
	@bash tools/install_fuzz_deps.sh
	CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=Debug -DDI_FUZZ=ON -DDI_BUILD_TESTS=OFF
	cmake --build build-fuzz -j $(JOBS)

install: all
	cmake --install $(BUILD) --prefix $(PREFIX)

format:
	clang-format -i $$(git ls-files '*.c' '*.h' '*.cu' '*.cuh')

clean:
	rm -rf $(BUILD) build-fuzz
