#include "layout/layout_json.h"

#include <fmt/format.h>

#include "base/check.h"
#include "base/error.h"

namespace zero {

namespace {

bool included(const std::string& field, LayoutFields which) {
  return which == LayoutFields::kAll || !is_engine_field(field);
}

}  // namespace

Layout read_layout_json(const nlohmann::json& j, const std::string& where, LayoutFields which, const Layout& base) {
  if (!j.is_object()) ZERO_THROW(InvalidArgument, "{} must be an object, got {}", where, j.dump());
  Layout l = base;
  for (const auto& [key, value] : j.items()) {
    const std::string path = fmt::format("{}.{}", where, key);
    bool known = false;
    for (const std::string& f : layout_fields()) known = known || f == key;
    if (!known || !included(key, which)) {
      ZERO_THROW(InvalidArgument, "{}: not a layout field{} (the fields: {})", path,
                 known ? " of this section (the engine's options carry it)" : "",
                 [&] {
                   std::string s;
                   for (const std::string& f : layout_fields()) {
                     if (included(f, which)) s += (s.empty() ? "" : ", ") + f;
                   }
                   return s;
                 }());
    }
    std::string text;
    switch (layout_field_kind(key)) {
      case LayoutFieldKind::kInteger:
        if (!value.is_number_integer()) ZERO_THROW(InvalidArgument, "{} must be an integer, got {}", path, value.dump());
        text = std::to_string(value.get<int64_t>());
        break;
      case LayoutFieldKind::kBoolean:
        if (!value.is_boolean()) ZERO_THROW(InvalidArgument, "{} must be true or false, got {}", path, value.dump());
        text = value.get<bool>() ? "true" : "false";
        break;
      case LayoutFieldKind::kText:
        if (!value.is_string()) ZERO_THROW(InvalidArgument, "{} must be a string, got {}", path, value.dump());
        text = value.get<std::string>();
        break;
    }
    set_layout_field(l, key, text, where);
  }
  return l;
}

nlohmann::ordered_json layout_json(const Layout& layout, LayoutFields which) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  for (const std::string& f : layout_fields()) {
    if (!included(f, which)) continue;
    const std::string text = layout_field_text(layout, f);
    switch (layout_field_kind(f)) {
      case LayoutFieldKind::kInteger: j[f] = std::stoi(text); break;
      case LayoutFieldKind::kBoolean: j[f] = text == "true"; break;
      case LayoutFieldKind::kText: j[f] = text; break;
    }
  }
  return j;
}

}  // namespace zero
