// The headers most unit tests include, precompiled once per build tree
// (tests/CMakeLists.txt, cairn_unit_pch): gtest, the standard library and the
// storage and format interfaces. Every test still includes what it uses.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "cairn/status.hpp"
#include "format/manifest.hpp"
#include "format/shard.hpp"
#include "storage/storage_env.hpp"
