// Precompiled header for dtorch's own translation units (not installed for users).
// torch/torch.h alone costs ~15 s to parse; paying it once per target keeps builds short.
#pragma once
#include <torch/torch.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>
