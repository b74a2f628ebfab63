#pragma once
// A Layout (layout.h) as a JSON object: the checkpoint manifest's "layout" (every field) and a config
// file's "parallel" section (the fields a config does not keep with the engine's options). Both go
// through layout.h's one description of the fields, so the text form, the flags and JSON agree.
#include <string>

#include <nlohmann/json.hpp>

#include "layout/layout.h"

namespace zero {

enum class LayoutFields {
  kAll,
  kParallel,  // all but is_engine_field's (stage, offload, micro-batches): a config's "parallel" section
};

// Fields of `j` (an object) over `base`: integers, booleans and strings as the field's kind; absent
// fields keep base's. InvalidArgument "<where>.<field>: ..." for a value of the wrong JSON type or
// range, or a key that is not one of `which`. The rules between fields are validate()'s (not run).
Layout read_layout_json(const nlohmann::json& j, const std::string& where, LayoutFields which, const Layout& base = {});
// Every field of `which`, in layout_fields() order.
nlohmann::ordered_json layout_json(const Layout& layout, LayoutFields which);

}  // namespace zero
