// The outputs of a scaling sweep: throughput, speedup and efficiency against the smallest successful
// run, the pipeline bubble bound, and sweep.csv, a markdown table and a standalone SVG plot built
// from them.
#include "launcher/run/sweep_report.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "schedule/schedule.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"

namespace stagehand {
namespace {

constexpr double kGiB = static_cast<double>(int64_t{1} << 30);

// A run with a step time: one whose throughput can be measured.
bool Timed(const SweepPoint& p) { return p.ok && p.step_seconds > 0; }

// The base must have a usable throughput, or every speedup would divide by zero; ties keep the first
// in the vector so the choice does not depend on the sort order of the caller.
const SweepPoint* Base(const std::vector<SweepPoint>& points) {
  const SweepPoint* base = nullptr;
  for (const SweepPoint& p : points) {
    if (p.workers <= 0 || !(Throughput(points, p) > 0)) continue;
    if (base == nullptr || p.workers < base->workers) base = &p;
  }
  return base;
}

std::string ThroughputText(double v) { return absl::StrFormat(v >= 100 ? "%.0f" : "%.2f", v); }

// Throughput of a run in units of one worker under the bubble-only model: each of workers/stages
// data-parallel replicas of a pipeline reaches PipelineSpeedupBound(stages, m); a run that is not a pipeline
// (stages 0) has no bubble. The data-parallel factor keeps the bound meaningful when workers > stages.
double ModelThroughput(const SweepPoint& p) {
  if (p.stages <= 0) return p.workers;
  const int replicas = std::max(1, p.workers / p.stages);
  return replicas * PipelineSpeedupBound(p.stages, p.micro_batches);
}

// The bound on Speedup(p) under the bubble model: the model's throughput at p over the base's. For a
// base of one worker this is PipelineSpeedupBound itself; for a larger base, it assumes the base also ran at its
// own bound, which is the only way to compare with a speedup measured against it. 0 when the point did
// not run, is not a pipeline, or has no base.
double SpeedupBound(const std::vector<SweepPoint>& points, const SweepPoint& p) {
  const SweepPoint* base = Base(points);
  if (base == nullptr || !p.ok || p.stages <= 0) return 0;
  const double base_throughput = ModelThroughput(*base);
  return base_throughput > 0 ? ModelThroughput(p) / base_throughput : 0;
}

// Skipped and failed points share ok == false; a failed run made a run directory and a skipped one
// never started, so that is what tells them apart.
std::string NotOkKind(const SweepPoint& p) { return p.run_dir.empty() ? "skipped" : "failed"; }

std::string Status(const SweepPoint& p) {
  if (p.ok) return "ok";
  return p.note.empty() ? NotOkKind(p) : absl::StrCat(NotOkKind(p), ": ", p.note);
}

// Newlines would break a CSV row or a markdown table row whatever the quoting.
std::string OneLine(const std::string& s) { return absl::StrReplaceAll(s, {{"\r\n", " "}, {"\n", " "}, {"\r", " "}}); }

std::string MaxGiB(const std::vector<int64_t>& bytes) {
  if (bytes.empty()) return "";
  return absl::StrFormat("%.3f", *std::max_element(bytes.begin(), bytes.end()) / kGiB);
}

// RFC 4180: a field with a separator, quote or line break is quoted, with its quotes doubled.
std::string CsvField(const std::string& s) {
  if (s.find_first_of(",\"\r\n") == std::string::npos) return s;
  return absl::StrCat("\"", absl::StrReplaceAll(s, {{"\"", "\"\""}}), "\"");
}

std::string CsvRow(const std::vector<SweepPoint>& points, const SweepPoint& p) {
  // Commas in the note become semicolons so that naive splitters (cut, awk -F,) still see 11 columns.
  const std::string status = absl::StrReplaceAll(OneLine(Status(p)), {{",", ";"}});
  std::vector<std::string> f = {absl::StrCat(p.workers), absl::StrCat(p.stages), status};
  if (p.ok) {
    const double bound = SpeedupBound(points, p);
    f.push_back(absl::StrFormat("%.6f", p.step_seconds));
    f.push_back(absl::StrFormat("%.1f", p.tokens_per_second));
    f.push_back(absl::StrFormat("%.1f", p.samples_per_second));
    f.push_back(absl::StrFormat("%.4f", Speedup(points, p)));
    f.push_back(absl::StrFormat("%.4f", Efficiency(points, p)));
    f.push_back(bound > 0 ? absl::StrFormat("%.4f", bound) : "");
    f.push_back(MaxGiB(p.peak_memory_bytes));
  } else {
    f.insert(f.end(), 7, "");  // a run that did not finish has no measurements
  }
  f.push_back(OneLine(p.run_dir));
  for (std::string& field : f) field = CsvField(field);
  return absl::StrCat(absl::StrJoin(f, ","), "\n");
}

// A '|' inside a cell would end the cell.
std::string MdCell(const std::string& s) { return absl::StrReplaceAll(OneLine(s), {{"|", "\\|"}}); }

std::string MdMemory(const std::vector<int64_t>& bytes) {
  if (bytes.empty()) return "-";
  // CPU workers measure no device memory: n/a, not a GPU with 0.0 GiB.
  if (std::all_of(bytes.begin(), bytes.end(), [](int64_t b) { return b == 0; })) return "n/a";
  return absl::StrJoin(bytes, " / ", [](std::string* out, int64_t b) { absl::StrAppendFormat(out, "%.1f", b / kGiB); });
}

std::string MdRow(const std::vector<SweepPoint>& points, const SweepPoint& p) {
  std::vector<std::string> f = {absl::StrCat(p.workers), absl::StrCat(p.stages)};
  if (p.ok) {
    const double bound = SpeedupBound(points, p);
    f.push_back(absl::StrFormat("%.4f", p.step_seconds));
    f.push_back(ThroughputText(Throughput(points, p)));
    f.push_back(absl::StrFormat("%.2fx", Speedup(points, p)));
    f.push_back(absl::StrFormat("%.1f%%", 100 * Efficiency(points, p)));
    f.push_back(bound > 0 ? absl::StrFormat("%.2fx", bound) : "-");
    f.push_back(MdMemory(p.peak_memory_bytes));
  } else {
    f.push_back(MdCell(Status(p)));
    f.insert(f.end(), 5, "");
  }
  return absl::StrCat("| ", absl::StrJoin(f, " | "), " |\n");
}

// ---- SVG ----

constexpr double kWidth = 640, kHeight = 420;
constexpr double kLeft = 70, kRight = 615, kTop = 50, kBottom = 355;  // the plot area
// A generic family: nothing to embed or fetch, so the file stands alone.
constexpr char kFont[] = "font-family=\"sans-serif\"";
constexpr char kBlue[] = "#1f77b4";

// Attribute values and text both: quotes too, since the same helper serves both. Control characters
// other than tab and line breaks are not allowed anywhere in XML 1.0, so they are dropped.
std::string XmlEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        if (static_cast<unsigned char>(c) >= 0x20 || c == '\t' || c == '\n' || c == '\r') out += c;
    }
  }
  return out;
}

// Coordinates never print as nan or inf, which would make the SVG invalid.
std::string Num(double v) { return std::isfinite(v) ? absl::StrFormat("%.1f", v) : "0"; }

struct Scale {
  double x_max = 1;  // the x axis runs from 0
  double y_max = 1;  // the y axis runs from 0
  double y_step = 0.2;
  double X(double workers) const { return kLeft + workers / x_max * (kRight - kLeft); }
  double Y(double speedup) const { return kBottom - speedup / y_max * (kBottom - kTop); }
};

// A round step giving 4 or 5 intervals (5-6 ticks): the candidates are never more than 1.5x apart, so
// the smallest with at most 5 intervals has more than 5/1.5 of them.
double NiceStep(double top) {
  const double magnitude = std::pow(10, std::floor(std::log10(top / 5)));
  for (double c : {1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0}) {
    if (top / (c * magnitude) <= 5 + 1e-9) return c * magnitude;
  }
  return 10 * magnitude;
}

struct Series {
  std::vector<std::pair<double, double>> ideal, bound, measured;  // (workers, speedup)
};

// Ideal spans every count the sweep asked for (a reference, not a measurement); the bound and the
// measured line only the points that ran.
Series MakeSeries(const std::vector<SweepPoint>& points) {
  Series s;
  const SweepPoint* base = Base(points);
  std::vector<const SweepPoint*> sorted;
  for (const SweepPoint& p : points) sorted.push_back(&p);
  std::stable_sort(sorted.begin(), sorted.end(), [](auto* a, auto* b) { return a->workers < b->workers; });
  for (const SweepPoint* p : sorted) {
    if (base != nullptr && (s.ideal.empty() || s.ideal.back().first != p->workers)) {
      s.ideal.push_back({p->workers, static_cast<double>(p->workers) / base->workers});
    }
    if (!p->ok) continue;
    const double bound = SpeedupBound(points, *p);
    if (bound > 0) s.bound.push_back({p->workers, bound});
    s.measured.push_back({p->workers, Speedup(points, *p)});
  }
  return s;
}

Scale MakeScale(const std::vector<SweepPoint>& points, const Series& s) {
  Scale scale;
  for (const SweepPoint& p : points) scale.x_max = std::max<double>(scale.x_max, p.workers);
  double top = 0;
  for (const auto* series : {&s.ideal, &s.bound, &s.measured}) {
    for (const auto& [w, v] : *series) top = std::max(top, v);
  }
  top = top > 0 ? top * 1.1 : 1;
  scale.y_step = NiceStep(top);
  scale.y_max = std::ceil(top / scale.y_step - 1e-9) * scale.y_step;  // end the axis on a tick
  return scale;
}

std::string Line(double x1, double y1, double x2, double y2, const std::string& style) {
  return absl::StrFormat("<line x1=\"%s\" y1=\"%s\" x2=\"%s\" y2=\"%s\" %s/>\n", Num(x1), Num(y1), Num(x2), Num(y2),
                         style);
}

std::string Text(double x, double y, const std::string& anchor, const std::string& text,
                 const std::string& extra = "") {
  return absl::StrFormat("<text x=\"%s\" y=\"%s\" text-anchor=\"%s\" %s%s>%s</text>\n", Num(x), Num(y), anchor, extra,
                         kFont, XmlEscape(text));
}

std::string Polyline(const Scale& sc, const std::vector<std::pair<double, double>>& pts, const std::string& style) {
  std::vector<std::string> xy;
  for (const auto& [w, v] : pts) xy.push_back(absl::StrCat(Num(sc.X(w)), ",", Num(sc.Y(v))));
  return absl::StrFormat("<polyline points=\"%s\" fill=\"none\" %s/>\n", absl::StrJoin(xy, " "), style);
}

std::string Axes(const std::vector<SweepPoint>& points, const Scale& sc) {
  std::string out;
  const int ticks = static_cast<int>(std::lround(sc.y_max / sc.y_step));
  for (int i = 0; i <= ticks; ++i) {
    const double v = i * sc.y_step, y = sc.Y(v);
    out += Line(kLeft, y, kRight, y, "stroke=\"#dddddd\" stroke-width=\"1\"");
    out += Text(kLeft - 8, y + 4, "end", absl::StrFormat("%g", v), "font-size=\"12\" ");
  }
  std::vector<int> counts;
  for (const SweepPoint& p : points) counts.push_back(p.workers);
  std::sort(counts.begin(), counts.end());
  counts.erase(std::unique(counts.begin(), counts.end()), counts.end());
  for (int w : counts) {
    out += Line(sc.X(w), kBottom, sc.X(w), kBottom + 5, "stroke=\"#000000\" stroke-width=\"1\"");
    out += Text(sc.X(w), kBottom + 20, "middle", absl::StrCat(w), "font-size=\"12\" ");
  }
  out += Line(kLeft, kBottom, kRight, kBottom, "stroke=\"#000000\" stroke-width=\"1\"");
  out += Line(kLeft, kTop, kLeft, kBottom, "stroke=\"#000000\" stroke-width=\"1\"");
  return out;
}

// The x axis has a tick for every count the sweep asked for; one with no point drawn says why, so an
// empty stretch of the plot does not read as missing data.
std::string NotRunLabels(const std::vector<SweepPoint>& points, const Scale& sc) {
  std::set<int> labelled;  // counts with a drawn point need no label, and no count gets two
  for (const SweepPoint& p : points) {
    if (p.ok) labelled.insert(p.workers);
  }
  std::string out;
  for (const SweepPoint& p : points) {
    if (p.ok || !labelled.insert(p.workers).second) continue;
    out += Text(sc.X(p.workers), kBottom + 32, "middle", NotOkKind(p), "font-size=\"10\" fill=\"#888888\" ");
  }
  return out;
}

std::string AxisLabels(const std::vector<SweepPoint>& points) {
  const SweepPoint* base = Base(points);
  const std::string y_label =
      base == nullptr ? "speedup"
                      : absl::StrFormat("speedup over %d worker%s", base->workers, base->workers == 1 ? "" : "s");
  const double mid_y = (kTop + kBottom) / 2;
  return Text((kLeft + kRight) / 2, kHeight - 12, "middle", "workers", "font-size=\"13\" ") +
         Text(22, mid_y, "middle", y_label,
              absl::StrFormat("font-size=\"13\" transform=\"rotate(-90 22 %s)\" ", Num(mid_y)));
}

constexpr char kIdealStyle[] = "stroke=\"#888888\" stroke-width=\"1.5\" stroke-dasharray=\"6 4\"";
constexpr char kBoundStyle[] = "stroke=\"#ff7f0e\" stroke-width=\"2\" stroke-dasharray=\"2 3\"";
constexpr char kMeasuredStyle[] = "stroke=\"#1f77b4\" stroke-width=\"2\"";

std::string Data(const Series& s, const Scale& sc) {
  std::string out = Polyline(sc, s.ideal, kIdealStyle) + Polyline(sc, s.bound, kBoundStyle) +
                    Polyline(sc, s.measured, kMeasuredStyle);
  for (const auto& [w, v] : s.measured) {
    out += absl::StrFormat("<circle cx=\"%s\" cy=\"%s\" r=\"4\" fill=\"%s\"/>\n", Num(sc.X(w)), Num(sc.Y(v)), kBlue);
    // Below the point, where the ideal and bound lines (above the measured one) do not run; on the
    // side towards the middle, so the labels of the end points stay inside the image.
    const bool right_half = sc.X(w) > (kLeft + kRight) / 2;
    out += Text(sc.X(w) + (right_half ? -7 : 7), sc.Y(v) + 16, right_half ? "end" : "start",
                absl::StrFormat("%.2fx", v), absl::StrFormat("font-size=\"12\" fill=\"%s\" ", kBlue));
  }
  return out;
}

// Top left of the plot: speedup rises to the right, so that corner is the one the data leaves empty.
std::string Legend() {
  const double x = kLeft + 10, y = kTop + 8;
  std::string out = absl::StrFormat(
      "<rect x=\"%s\" y=\"%s\" width=\"150\" height=\"66\" fill=\"#ffffff\" stroke=\"#cccccc\"/>\n", Num(x), Num(y));
  const std::pair<const char*, const char*> entries[] = {
      {kIdealStyle, "ideal (linear)"}, {kBoundStyle, "bubble bound"}, {kMeasuredStyle, "measured"}};
  double row = y + 16;
  for (const auto& [style, label] : entries) {
    out += Line(x + 8, row - 4, x + 38, row - 4, style);
    out += Text(x + 46, row, "start", label, "font-size=\"12\" ");
    row += 20;
  }
  return out;
}

}  // namespace

std::string ThroughputUnit(const std::vector<SweepPoint>& points) {
  bool timed = false, tokens = true, samples = true;
  for (const SweepPoint& p : points) {
    if (!Timed(p)) continue;
    timed = true;
    tokens = tokens && p.tokens_per_second > 0;
    samples = samples && p.samples_per_second > 0;
  }
  return !timed ? "steps/s" : tokens ? "tokens/s" : samples ? "samples/s" : "steps/s";
}

double Throughput(const std::vector<SweepPoint>& points, const SweepPoint& p) {
  if (!Timed(p)) return 0;
  const std::string unit = ThroughputUnit(points);
  if (unit == "tokens/s") return p.tokens_per_second;
  if (unit == "samples/s") return p.samples_per_second;
  return 1 / p.step_seconds;
}

double Speedup(const std::vector<SweepPoint>& points, const SweepPoint& p) {
  const SweepPoint* base = Base(points);
  if (base == nullptr) return 0;
  return Throughput(points, p) / Throughput(points, *base);
}

double Efficiency(const std::vector<SweepPoint>& points, const SweepPoint& p) {
  const SweepPoint* base = Base(points);
  if (base == nullptr || p.workers <= 0) return 0;
  return Speedup(points, p) * base->workers / p.workers;
}

double PipelineSpeedupBound(int stages, int micro_batches) {
  if (stages <= 0) return 0;  // no pipeline: nothing to bound, and m == 1 would divide 0 by 0
  if (micro_batches <= 0) return stages;
  // p stages each busy for all but the schedule's bubble (schedule/schedule.h).
  return stages * (1 - BubbleBound(stages, micro_batches));
}

std::string SweepCsv(const std::vector<SweepPoint>& points) {
  std::string out =
      "workers,stages,status,step_seconds,tokens_per_second,samples_per_second,speedup,efficiency,bubble_bound,"
      "peak_memory_gib_max,run_dir\n";
  for (const SweepPoint& p : points) out += CsvRow(points, p);
  return out;
}

std::string SweepMarkdown(const std::vector<SweepPoint>& points, const std::string& title) {
  std::string out = absl::StrCat("## ", OneLine(title), "\n\n");
  out += absl::StrCat("| workers | stages | step time (s) | ", ThroughputUnit(points),
                      " | speedup | efficiency | bound | memory per GPU (GiB) |\n");
  out += "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n";
  for (const SweepPoint& p : points) out += MdRow(points, p);
  return out;
}

std::string SweepSvg(const std::vector<SweepPoint>& points, const std::string& title) {
  const Series series = MakeSeries(points);
  const Scale scale = MakeScale(points, series);
  std::string out =
      absl::StrFormat("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\">\n",
                      int(kWidth), int(kHeight), int(kWidth), int(kHeight));
  out += absl::StrFormat("<rect x=\"0\" y=\"0\" width=\"%d\" height=\"%d\" fill=\"#ffffff\"/>\n", int(kWidth),
                         int(kHeight));
  out += Text(kWidth / 2, 28, "middle", OneLine(title), "font-size=\"16\" font-weight=\"bold\" ");
  out += Axes(points, scale) + NotRunLabels(points, scale) + AxisLabels(points) + Data(series, scale) + Legend();
  return out + "</svg>\n";
}

}  // namespace stagehand
