// How attention spans a context-parallel group: ring attention or Ulysses. Apart from
// context_parallel.h so that a run's plain settings (train/config/) name it without the
// communicator.
#pragma once

#include "dtorch/core/enum_names.h"

namespace dtorch::cp {

enum class Kind {
  /// Keys and values passed around the group (Note [Ring attention]).
  Ring,
  /// Two all-to-alls between a sequence split and a head split (Note [Ulysses]).
  Ulysses,
};
/// "ring", "ulysses" (Note [Closed sets]).
const NameTable<Kind>& names(Kind);

}  // namespace dtorch::cp
