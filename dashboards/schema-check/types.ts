// Hand-written helpers for the generated dashboards.gen.ts (see dashboards/build.py).
import type { DataQuery } from "@grafana/schema";

/**
 * The target of a Prometheus annotation: what @grafana/prometheus's `prepareAnnotation`
 * (src/annotations.ts) keeps there, the query and its minimum step.
 */
export interface PromAnnotationTarget extends DataQuery {
  expr: string;
  interval?: string;
}

/**
 * The fields @grafana/prometheus's `processEvents` reads from the annotation itself, beside
 * `target`: `AnnotationQuery` in @grafana/schema does not type these plugin keys.
 */
export interface PromAnnotationFields {
  titleFormat?: string;
  textFormat?: string;
  tagKeys?: string;
  useValueForTime?: boolean;
}

/**
 * The schema type with each string enum also accepting its values ("absolute" for
 * ThresholdsMode.Absolute): dashboard JSON holds the values, not the TypeScript enum members.
 * Every other check (field names, nesting, required fields, value types) is the schema's own.
 */
export type Loose<T> = T extends string
  ? T | `${T}`
  : T extends Array<infer U>
    ? Array<Loose<U>>
    : T extends object
      ? { [K in keyof T]: Loose<T[K]> }
      : T;
